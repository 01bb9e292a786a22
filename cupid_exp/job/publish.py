"""Phase 4 of a job: write its files, finish its MLflow run, print its table (and, before phase 2,
open that run: ``start_tracking``).

instances.jsonl and metrics.json land in the Hydra job folder first (atomically), so a tracking
failure can never cost the results; the run worker draws the plots while the table is computed and printed.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from cupid_exp import console
from cupid_exp.entry import Outcome
from cupid_exp.job.budgets import BudgetReport, fit_line
from cupid_exp.job.plan import JobPlan
from cupid_exp.outputs import write_json, write_jsonl
from cupid_exp.scoring.summary import JobSummary
from cupid_exp.secrets import scrub_obj
from cupid_exp.durability.attempts import whole_job_metrics, whole_job_usage
from cupid_exp.tracking.live import FinalLog, PlotRequest
from cupid_exp.tracking.mlflow import SweepParent, flatten
from cupid_exp.tracking.outcomes import outcome_tags, status_of
from cupid_exp.tracking.provenance import git_state
from cupid_exp.durability.signals import shielded

log = logging.getLogger(__name__)


def title(plan: JobPlan) -> str:
    cfg = plan.cfg
    return console.header(cfg.task.name, {"model": cfg.model.name, "setting": plan.setting.label(),
                                          "evaluator": cfg.evaluator.name, "data": cfg.data.name})


def run_name(plan: JobPlan) -> str:
    cfg = plan.cfg
    return cfg.tracking.run_name or f"{cfg.model.name}-{cfg.task.name}-{plan.setting.label()}"


def start_tracking(plan: JobPlan) -> Any:
    """Have the job's MLflow run opened before any model is called: params, tags and the dataset input first,
    then progress while the job works. A resumed job reopens its earlier attempt's run (``tracking.attempt_runs``).

    The run is kept by a worker process (``tracking.run_worker``), asked here and waited for only before the
    first call (``wait_opened``), so that opening it overlaps the job's own start; without a worker, here.
    """
    from cupid_exp.durability import attempts
    from cupid_exp.tracking import run_worker
    from cupid_exp.tracking.dataset import dataset_input
    from cupid_exp.tracking.live import RunRequest, open_run

    cfg = plan.cfg
    if not cfg.tracking.enabled or plan.dry_run:
        return None
    # first: its own Python and `import mlflow` overlap everything after; a sweep's job (it has a parent run)
    # takes the worker the previous job left, and leaves it to the next
    worker = run_worker.start(keep=plan.parent_run is not None)
    claim = None
    try:
        key = attempts.run_key(plan.identity, cfg.runtime, cfg.paths.output_root)
        # the job's lock (``durability.job_lock``) makes this the only attempt: a resumed job reopens the earlier run
        claim = attempts.Claim(key, plan.lock if cfg.runtime.resume else None)
        params = flatten(plan.resolved)
        params.update({f"choice.{k}": str(v) for k, v in plan.choices.items()})
        tags = {"dataset_digest": plan.data.digest, "dataset_source": plan.data.source,
                "prompts_digest": plan.prompts_digest, "output_dir": str(plan.output_dir.resolve()),
                "job_identity": plan.identity}
        request = RunRequest(
            tracking=cfg.tracking, secrets=list(plan.secrets), run_name=run_name(plan), params=params, tags=tags,
            config=plan.resolved, parent=plan.parent_run, run_key=key, exclusive=claim.exclusive,
            dataset=dataset_input(cfg.data, plan.data), total=len(plan.data.instances), parts=plan.parts,
            policy=cfg.runtime.failure_policy, done=list(plan.done.values()),
            earlier=attempts.earlier_spend(plan.earlier), traces=bool(cfg.tracking.traces and plan.data.instances),
            # the journalled instances' inputs: a trace the run lacks is rebuilt from its record (``reopen``)
            shown={i.key: (i.current_request, i.current_context_factor) for i in plan.data.instances
                   if i.key in plan.done},
            nothing_left=not plan.todo, ledger_found=plan.ledger is None or plan.ledger.path.exists(),
            trace_tags=_trace_tags(plan), judges=_judges(plan), plots=_plots(plan))
        if worker is not None:
            worker.open(request, claim, plan.meter)
            return worker
        return open_run(request, claim, plan.meter)
    except BaseException:
        if worker is not None:
            worker.abandon()
        if claim is not None:
            claim.release()
        raise


def _trace_tags(plan: JobPlan) -> dict[str, str]:
    cfg = plan.cfg
    return {"cupid.model": cfg.model.name, "cupid.setting": plan.setting.label(), "cupid.task": cfg.task.name,
            "cupid.evaluator": cfg.evaluator.name, "cupid.data": cfg.data.name}


def _judges(plan: JobPlan) -> dict[str, str]:
    """Whose labels each part's scores come from (the feedback's source)."""
    ev = plan.cfg.evaluator
    return {"inference": ev.matcher.name, "generation": ev.judge.name}


def write_outputs(plan: JobPlan, summary: JobSummary, complete: bool | None = None) -> None:
    """instances.jsonl and metrics.json; a dry run's replies are placeholders: it writes no record and no score."""
    plan.output_dir.mkdir(parents=True, exist_ok=True)
    if not plan.dry_run:
        write_jsonl(plan.output_dir / "instances.jsonl", scrub_obj(summary.records, plan.secrets))
    metrics = console.dry_run_metrics(summary.metrics) if plan.dry_run else summary.metrics
    write_json(plan.output_dir / "metrics.json", {
        "dry_run": plan.dry_run, "git": git_state(), "metrics": metrics,
        "breakdown": {} if plan.dry_run else summary.nested,
        "errors": summary.errors, "usage": plan.meter.as_dict(),
        "complete": summary.complete if complete is None else complete, "failed_instances": summary.failed_instances,
        "failure_reasons": summary.failure_reasons(),
        "data": {"source": plan.data.source, "digest": plan.data.digest, "instances": len(plan.data.instances),
                 "bad_rows": [str(e) for e in plan.data.errors]},
        "prompts_digest": plan.prompts_digest})


def _plots(plan: JobPlan) -> PlotRequest:
    """Score by type, score vs relevant-session position (paper Fig. 3), vs history length (Fig. 9)."""
    cfg = plan.cfg
    return PlotRequest(parts=tuple(plan.parts), folder=str(plan.output_dir / "plots"), seed=cfg.seed,
                       failure_policy=cfg.runtime.failure_policy,
                       title_prefix=f"{cfg.model.name} {plan.setting.label()}",
                       order=tuple(i.key for i in plan.data.instances))


def job_outcome(plan: JobPlan, summary: JobSummary, spending: BudgetReport | None = None) -> Outcome:
    """How a job that got through ends (its exit code, its one line): stopped by its budget, incomplete (more
    failed instances than ``runtime.max_failed_fraction``), or ok."""
    if spending is not None and spending.stopped:
        return Outcome("budget", spending.line(), headline(summary))
    if summary.over_threshold and not plan.dry_run:
        return Outcome("incomplete", summary.status_line(), headline(summary))
    return Outcome("ok", "", headline(summary))


def restore_folder(plan: JobPlan, had_hydra: bool) -> None:
    """A job folder deleted while the job ran (Hydra's ``.hydra/`` was there when it started) is made again, with
    the resolved config (secrets redacted) as ``.hydra/config.yaml``, and said in one line."""
    hydra = plan.output_dir / ".hydra"
    if not had_hydra or hydra.is_dir():
        return
    from omegaconf import OmegaConf

    from cupid_exp.outputs import atomic_write_text

    atomic_write_text(hydra / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(plan.resolved)))
    print(f"job folder {plan.output_dir} was deleted while the job ran: made again with its results and "
          ".hydra/config.yaml (the resolved config; Hydra's overrides.yaml and hydra.yaml are lost)",
          file=sys.stderr, flush=True)


def publish(plan: JobPlan, summary: JobSummary, tracker: Any, spending: BudgetReport | None = None, *,
            had_hydra: bool = False) -> None:
    """Files, then the console table, then MLflow (metrics, tags, artifacts, plots) and the run's end: FINISHED
    for a job that exits 0, else FAILED with its outcome (``tracking.outcomes``). A job its budget stopped
    (``spending``) is not complete, whatever the instances it ran. ``had_hydra``: the job folder had Hydra's
    ``.hydra/`` when the job started (a folder deleted since is made again: ``restore_folder``)."""
    live = tracker
    stopped = spending is not None and spending.stopped
    complete = summary.complete and not stopped
    outcome = job_outcome(plan, summary, spending)
    restore_folder(plan, had_hydra)
    write_outputs(plan, summary, complete)
    if plan.dry_run:
        estimate = plan.meter.totals().get("cost_usd", 0.0)
        sweep = plan.parent_run.sweep_dir if isinstance(plan.parent_run, SweepParent) else None
        console.show(console.dry_run_report(title(plan), plan.meter, fit_line(plan.cfg.runtime, estimate, sweep)),
                     plan.output_dir)
        return
    where = str(plan.output_dir)
    if live is not None:
        live.wait_opened()
        where += f" | MLflow run {live.run_id} at {plan.cfg.tracking.uri}"
        if live.notice:
            log.warning("MLflow: %s", live.notice)
    console.show(console.job_report(title(plan), summary.nested, summary.errors, summary.metrics,
                                    len(plan.data.errors), where,
                                    spending.status_line() if stopped else summary.status_line()), plan.output_dir)
    if live is None:
        return
    # The results are on disk and printed: logging them is held together, an interrupt waits for it (a few
    # seconds) and is delivered once the run has ended FINISHED. Raised half-way through MLflow's store
    # writes, it could leave a SQLite transaction or a lock behind and the run RUNNING.
    with shielded():
        m = summary.metrics
        # the run spans every attempt: usage for the whole job (the folder's metrics.json: this attempt's)
        whole = {**m, **whole_job_usage(plan.earlier, plan.meter), **whole_job_metrics(m)}
        live.finish(FinalLog(
            metrics=whole, step=summary.n_instances, status=status_of(outcome.outcome),
            tags={"cupid.complete": str(complete).lower(), "cupid.failed_instances": summary.failed_instances,
                  **outcome_tags(outcome.outcome, outcome.reason),
                  **({"cupid.batch_ids": " ".join(plan.meter.batches.ids)[:5000]} if plan.meter.batches.ids else {})},
            artifacts=[([str(plan.output_dir / name) for name in ("instances.jsonl", "metrics.json",
                                                                  console.RESULTS_FILE)], None),
                       ([str(p) for p in sorted((plan.output_dir / ".hydra").glob("*.yaml"))], ".hydra")],
            table=scrub_obj(summary.records, plan.secrets), plots=_plots(plan),
            summary={"calls": int(m.get("calls/total", 0)), "cost_usd": round(m.get("cost/usd", 0.0), 6)}))


def headline(summary: JobSummary) -> Any:
    """What Hydra's sweepers optimise: the first part's headline metric."""
    part = summary.parts[0]
    return summary.metrics.get(f"{part}/f1" if part == "inference" else f"{part}/score")
