"""A job's attempts share one MLflow run, found by ``cupid.run_key``; a SIGKILLed attempt is noted."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run


def earlier_run(client: MlflowClient, experiment_id: str, key: str) -> Run | None:
    """The latest run of ``key`` in the experiment, any status (None when there is none)."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.`cupid.run_key` = '{key}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


def attempt_tags(previous: Run | None, key: str) -> dict[str, str]:
    """``cupid.run_key`` and the attempt number; a previous attempt left RUNNING died without ending its run."""
    tags = {"cupid.run_key": key}
    if previous is None:
        tags["cupid.attempt"] = "1"
        return tags
    before = int(previous.data.tags.get("cupid.attempt", "1"))
    tags["cupid.attempt"] = str(before + 1)
    if previous.info.status == "RUNNING" and f"cupid.attempt.{before}" not in previous.data.tags:
        tags[f"cupid.attempt.{before}"] = "the process died without ending the run (e.g. SIGKILL)"
    return tags
