"""Tracking: publishing to MLflow (the job's run, the sweep's callbacks and parent, provenance)."""
