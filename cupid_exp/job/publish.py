"""Phase 4 of a job: write its files, finish its MLflow run, print its table.

instances.jsonl and metrics.json land in the Hydra job folder first (atomically), so a tracking
failure can never cost the results; plots are drawn after the table is printed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from cupid_exp import console
from cupid_exp.job.plan import JobPlan
from cupid_exp.outputs import write_json, write_jsonl
from cupid_exp.scoring.summary import JobSummary
from cupid_exp.secrets import scrub_obj
from cupid_exp.tracking.mlflow import RunTracker, flatten, records_table
from cupid_exp.tracking.provenance import git_state

log = logging.getLogger(__name__)


def title(plan: JobPlan) -> str:
    cfg = plan.cfg
    return console.header(cfg.task.name, {"model": cfg.model.name, "setting": plan.setting.label(),
                                          "evaluator": cfg.evaluator.name, "data": cfg.data.name})


def run_name(plan: JobPlan) -> str:
    cfg = plan.cfg
    return cfg.tracking.run_name or f"{cfg.model.name}-{cfg.task.name}-{cfg.setting.name}"


def start_tracking(plan: JobPlan) -> RunTracker | None:
    """Open the job's MLflow run with its params and tags before any model is called."""
    cfg = plan.cfg
    if not cfg.tracking.enabled or plan.dry_run:
        return None
    tracker = RunTracker(cfg.tracking, plan.secrets)
    params = flatten(plan.resolved)
    params.update({f"choice.{k}": str(v) for k, v in plan.choices.items()})
    tracker.start(run_name=run_name(plan), params=params, parent=plan.parent_run, config=plan.resolved,
                  tags={"dataset_digest": plan.data.digest, "dataset_source": plan.data.source,
                        "prompts_digest": plan.prompts_digest, "output_dir": str(plan.output_dir.resolve()),
                        "job_identity": plan.identity})
    return tracker


def write_outputs(plan: JobPlan, summary: JobSummary) -> None:
    records = scrub_obj(summary.records, plan.secrets)
    plan.output_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(plan.output_dir / "instances.jsonl", records)
    write_json(plan.output_dir / "metrics.json", {
        "dry_run": plan.dry_run, "git": git_state(), "metrics": summary.metrics, "breakdown": summary.nested,
        "errors": summary.errors, "usage": plan.meter.as_dict(),
        "complete": summary.complete, "failed_instances": summary.failed_instances,
        "failure_reasons": summary.failure_reasons(),
        "data": {"source": plan.data.source, "digest": plan.data.digest, "instances": len(plan.data.instances),
                 "bad_rows": [str(e) for e in plan.data.errors]},
        "prompts_digest": plan.prompts_digest})


def _plots(plan: JobPlan, summary: JobSummary) -> list[Path]:
    """Score by type, score vs relevant-session position (paper Fig. 3), vs history length (Fig. 9)."""
    from cupid_exp.reporting.plots import save_run_plots

    cfg = plan.cfg
    return save_run_plots(summary.records, plan.parts, plan.output_dir / "plots", seed=cfg.seed,
                          failure_policy=cfg.runtime.failure_policy,
                          title_prefix=f"{cfg.model.name} {plan.setting.label()}")


def publish(plan: JobPlan, summary: JobSummary, tracker: RunTracker | None) -> None:
    """Files, then the console table, then MLflow (metrics, tags, artifacts, plots) and the run's end."""
    write_outputs(plan, summary)
    if plan.dry_run:
        print(console.dry_run_report(title(plan), plan.meter))
        return
    where = str(plan.output_dir)
    if tracker is not None:
        where += f" | MLflow run {tracker.run_id} at {plan.cfg.tracking.uri}"
    print(console.job_report(title(plan), summary.nested, summary.errors, summary.metrics, len(plan.data.errors),
                             where, summary.status_line()), flush=True)
    if tracker is None:
        return
    tracker.log_metrics(summary.metrics)
    tracker.set_tags({"cupid.complete": str(summary.complete).lower(),
                      "cupid.failed_instances": summary.failed_instances})
    tracker.log_artifacts([plan.output_dir / "instances.jsonl", plan.output_dir / "metrics.json"])
    tracker.log_artifacts(sorted((plan.output_dir / ".hydra").glob("*.yaml")), ".hydra")
    tracker.log_table(records_table(scrub_obj(summary.records, plan.secrets)), "instances_table.json")
    tracker.log_artifacts(_plots(plan, summary), "plots")
    tracker.end("FINISHED")


def headline(summary: JobSummary) -> Any:
    """What Hydra's sweepers optimise: the first part's headline metric."""
    part = summary.parts[0]
    return summary.metrics.get(f"{part}/f1" if part == "inference" else f"{part}/score")
