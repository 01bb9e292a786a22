"""Tracking: publishing to MLflow. The job's run (live progress, one trace per instance, the dataset input, resumed
attempts), the sweep's Hydra callbacks and parent run, provenance. What a job keeps on its own disk to survive a
crash (journal, ledger, lock, signals) is ``cupid_exp.durability``."""

from cupid_exp.tracking.mlflow import PARENT_RUN_FILE, RunTracker, flatten, parent_run_id, records_table
from cupid_exp.tracking.provenance import git_state

__all__ = ["PARENT_RUN_FILE", "RunTracker", "flatten", "git_state", "parent_run_id", "records_table"]
