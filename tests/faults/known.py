"""Why a cell of the fault matrix fails today (its ``xfail``, strict: a fix makes it pass, and the marker must go; or
``flaky``, not strict: it fails some of the time): behaviour another branch lands, or a defect of the product found by
the matrix (what happens, where)."""

DISK_FILLS_UP = {"batch": "product bug: the job hangs (still running 60 s after the disk filled up)"}
DISK_FILLS_UP_SOMETIMES = {
    "workers": "product bug: a worker's ENOSPC (its usage ledger's line, named) is a traceback (WorkerFailed, "
               "job/workers.py), exit 1, when a worker's write meets the full disk first (seen in 6 runs of 7)",
    "sweep": "product bug: a sweep job's status file (entry.py, job_status.json) cannot be written on the full disk "
             "after its one line: the OSError ends the sweep in a traceback from Hydra's basic sweeper, exit 2 (seen "
             "in 3 runs of 11)"}
