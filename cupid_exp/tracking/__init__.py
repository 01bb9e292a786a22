"""Tracking: the job's MLflow run (live progress, one trace per instance, the dataset input, resumed
attempts), the sweep's Hydra callbacks and parent run, the resume journal, provenance."""

from cupid_exp.tracking.journal import Journal
from cupid_exp.tracking.mlflow import PARENT_RUN_FILE, RunTracker, flatten, parent_run_id, records_table
from cupid_exp.tracking.provenance import git_state

__all__ = ["Journal", "PARENT_RUN_FILE", "RunTracker", "flatten", "git_state", "parent_run_id",
           "records_table"]
