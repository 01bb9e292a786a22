"""Why a cell of the fault matrix fails today (its ``xfail``, strict: a fix makes it pass, and the marker must go):
behaviour another branch lands, or a defect of the product found by the matrix (what happens, where)."""

GARBLED_ROW_FAILS = ("product bug: a batch output line that cannot be read (the row answered and billed) fails "
                     "its instance as missing_row (502) instead of going into a later batch (llm/batch.py _collect): "
                     "exit 3")
FULL_DISK_AT_START = ("product bug: a full disk when the response cache is opened (diskcache's SQLite: 'database or "
                      "disk is full', llm/response_cache.py) is a traceback, exit 1, not the environment's exit 5")
_LINES = ("litellm's own log lines ('LiteLLM Cache: exception in add_cache: database or disk is full') reach stderr "
          "before the one line, which names no path ('environment failure: No space left on device [ENOSPC]')")
DISK_FILLS_UP = {"sync": f"product bug: {_LINES}", "synthesis": f"product bug: {_LINES}",
                 # the job's side passes (a worker's failure, the sweep's status file): what is left is llmdisk's
                 "sweep": f"product bug (llm layer): {_LINES}", "workers": f"product bug (llm layer): {_LINES}"}
