"""Scored job runs in a temporary MLflow store, logged as ``job.publish`` logs them (params from the composed
config, the data's real digest and source as tags, metrics from the records), for report tests."""

from __future__ import annotations

import json
import time
from pathlib import Path

from conftest import compose_config
from omegaconf import OmegaConf

from cupid_exp.data.loading import load_instances
from cupid_exp.scoring.summary import flat_metrics, task_metrics
from helpers.mlflow_runs import log_job_run


def data_tags(cfg) -> dict[str, str]:
    """The data tags a job logs (``dataset_digest``, ``dataset_source``); the Hub's data (offline here) gets a
    stand-in digest."""
    data_cfg = OmegaConf.to_object(cfg.data)
    if data_cfg.source == "hf":
        return {"dataset_digest": "d" * 16, "dataset_source": str(data_cfg.hf_name)}
    data = load_instances(data_cfg)
    return {"dataset_digest": data.digest, "dataset_source": data.source}


def sample_label() -> str:
    """The report's name for the shipped sample: 'sample [cupid_sample.jsonl #<digest>]'."""
    digest = data_tags(compose_config([]))["dataset_digest"]
    return f"sample [cupid_sample.jsonl #{digest[:8]}]"


def log(root: Path, overrides: list[str], records: list[dict], *, drop_records: int = 0, name: str = "run",
        metric_edit: dict | None = None, tags: dict | None = None) -> str:
    """Log a job as ``job.publish`` does: params from the composed config, metrics of its task parts from records.

    The fabricated runs were scored by the local evaluator unless their overrides name one (an API model
    would otherwise imply gpt4o)."""
    if not any(o.startswith("evaluator=") for o in overrides):
        overrides = [*overrides, "evaluator=local"]
    cfg = compose_config([f"paths.output_root={root}", *overrides], return_hydra_config=True)
    policy = cfg.runtime.failure_policy
    metrics = {}
    for part in cfg.task.parts:
        metrics.update(flat_metrics(part, task_metrics(records, part, policy)))
    metrics.update(metric_edit or {})
    job_dir = root / "jobs" / name
    job_dir.mkdir(parents=True)
    kept = records[:len(records) - drop_records]
    (job_dir / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    run_id = log_job_run(cfg, run_name=name, tags={**data_tags(cfg), **(tags or {})}, metrics=metrics,
                         artifacts=[job_dir / "instances.jsonl"])
    time.sleep(0.01)  # distinct start times
    return run_id
