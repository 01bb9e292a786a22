"""Durability: what a job keeps on its own disk and in its own process so that a crash, a kill or a second launch
loses nothing and runs nothing twice. The resume journal (``journal``), every paid request as it returns
(``ledger``), one process per job (``job_lock``), SIGTERM turned into an exception and run endings shielded
(``signals``), and what a job's attempts share (``attempts``). Nothing here imports MLflow: publishing is
``cupid_exp.tracking``'s, which reads these.
"""
