"""Durability: what a job keeps on its own disk and process so a crash, kill or second launch loses nothing and runs
nothing twice (``journal``, ``ledger``, ``job_lock``, ``signals``, ``attempts``). Imports no MLflow."""
