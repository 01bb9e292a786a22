"""Fabricate MLflow job runs the way a job logs them (``cupid_exp.job.publish`` through ``RunTracker``), so
reporting and diff tests read a store shaped like a real one without running a model."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from omegaconf import DictConfig, OmegaConf

from cupid_exp.secrets import redact
from cupid_exp.tracking.mlflow import RunTracker, flatten


def split_hydra(cfg: DictConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """A config composed with ``return_hydra_config=True`` -> (its resolved job config, its group choices)."""
    choices = {k: str(v) for k, v in OmegaConf.to_container(cfg.hydra.runtime.choices).items() if v is not None}
    job = cfg.copy()
    OmegaConf.set_struct(job, False)
    del job["hydra"]  # resolving it needs a running Hydra app (hydra.job.num, ...)
    return OmegaConf.to_container(job, resolve=True), choices


def log_job_run(cfg: DictConfig, *, run_name: str = "run", tags: Mapping[str, str] | None = None,
                metrics: Mapping[str, float] | None = None, artifacts: Iterable[Path] = (), table: Any = None,
                parent: str | None = None, status: str = "FINISHED") -> str:
    """Open, fill and close one job run: params and config.yaml from ``cfg``, then metrics and artifacts.

    ``cfg`` must carry its hydra node (compose with ``return_hydra_config=True``) for the group choices.
    """
    resolved, choices = split_hydra(cfg)
    resolved = redact(resolved)
    tracking = OmegaConf.to_object(cfg.tracking)
    tracker = RunTracker(tracking)
    params = flatten(resolved)
    params.update({f"choice.{k}": v for k, v in choices.items()})
    run_id = tracker.start(run_name=run_name, params=params, tags=dict(tags or {}), parent=parent, config=resolved)
    tracker.log_metrics(dict(metrics or {}))
    tracker.log_artifacts([Path(p) for p in artifacts])
    tracker.log_table(table, "instances_table.json")
    tracker.end(status)
    return run_id
