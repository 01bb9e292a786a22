"""Tracking: publishing to MLflow (the job's run, the sweep's callbacks and parent, provenance)."""

from cupid_exp.tracking.mlflow import PARENT_RUN_FILE, RunTracker, flatten, parent_run_id, records_table
from cupid_exp.tracking.provenance import git_state

__all__ = ["PARENT_RUN_FILE", "RunTracker", "flatten", "git_state", "parent_run_id", "records_table"]
