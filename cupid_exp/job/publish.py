"""Phase 4 of a job: files first (atomically, so tracking can never cost the results), then the report (printed and
kept in ``results.txt``; its last line says whether the job is complete: scripts read it), then the MLflow run's end
(FINISHED only for exit 0). ``start_tracking`` opens the run before phase 2."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from cupid_exp.durability.attempts import whole_job_metrics, whole_job_usage
from cupid_exp.durability.signals import shielded
from cupid_exp.errors import Outcome
from cupid_exp.job.budgets import BudgetReport, fit_line
from cupid_exp.job.spec import Job, Summary
from cupid_exp.llm.usage import UsageMeter, usage_line
from cupid_exp.outputs import atomic_write_text
from cupid_exp.run_outcomes import DESCRIPTION_TAG, outcome_tags, status_of
from cupid_exp.tracking.live import FinalLog
from cupid_exp.tracking.mlflow import SweepParent, flatten, headline

if TYPE_CHECKING:  # imported by the tables when they are drawn, after the job's calls
    import pandas as pd

log = logging.getLogger(__name__)


def start_tracking(job: Job) -> Any:
    """Have the MLflow run opened (or a resumed job's reopened) while the job starts; awaited before the first call."""
    from cupid_exp.durability import attempts
    from cupid_exp.tracking import run_worker
    from cupid_exp.tracking.live import RunRequest, TraceRequest, Units, open_run

    cfg, spec, attempt, view = job.cfg, job.spec, job.attempt, job.work.tracking
    if not cfg.tracking.enabled or job.dry_run or view is None:
        return None
    shown = {k: v for k, v in view.shown.items() if k in attempt.done}
    # first: its own Python and `import mlflow` overlap everything after; a sweep's job (it has a parent run)
    # takes the worker the previous job left, and leaves it to the next
    worker = run_worker.start(keep=spec.parent_run is not None)
    claim = None
    try:
        # the job's lock (``durability.job_lock``) makes this the only attempt: a resumed job reopens the earlier run
        claim = attempts.Claim(spec.run_key, attempt.lock if cfg.runtime.resume else None)
        params = flatten(dict(spec.resolved))
        params.update({f"choice.{k}": str(v) for k, v in spec.choices.items()})
        tags = {**view.tags, "output_dir": str(job.output_dir.resolve()), "job_identity": spec.identity}
        request = RunRequest(
            tracking=cfg.tracking, secrets=list(spec.secrets), run_name=view.run_name, params=params, tags=tags,
            config=dict(spec.resolved), parent=spec.parent_run, run_key=spec.run_key, exclusive=claim.exclusive,
            dataset=view.dataset, units=Units(len(job.work.units), view.parts, view.policy, list(attempt.done.values()),
                                              attempts.earlier_spend(attempt.earlier), f"{job.work.noun}s"),
            # the journalled units' inputs: a trace the run lacks is rebuilt from its record (``tracking.reopen``)
            traces=TraceRequest(view.trace_tags, view.judges, shown)
            if cfg.tracking.traces and job.work.units else None, nothing_left=not job.todo,
            ledger_found=attempt.ledger is None or attempt.ledger.path.exists(), plots=view.plots)
        if worker is not None:
            worker.open(request, claim, attempt.meter)
            return worker
        return open_run(request, claim, attempt.meter)
    except BaseException:
        if worker is not None:
            worker.abandon()
        if claim is not None:
            claim.release()
        raise


def results_line(job: Job, summary: Summary, metrics: dict[str, float], tags: dict[str, str]) -> str:
    """The run's results at a glance, for its name and description (``tracking.mlflow.headline``)."""
    total, units = len(job.work.units), f"{job.work.noun}s"
    failed = int(tags.get(f"cupid.failed_{units}", "0") or 0)  # the kind's own tag: failed instances, personas
    return headline(metrics, max(summary.n_units - failed, 0), total, units)


def job_outcome(job: Job, summary: Summary, spending: BudgetReport | None = None) -> Outcome:
    """How a job ends: budget-stopped, incomplete (over ``runtime.max_failed_fraction``), or ok."""
    headline = summary.headline
    if spending is not None and spending.stopped:
        return Outcome("budget", spending.line(), headline)
    if summary.over_threshold and not job.dry_run:
        return Outcome("incomplete", summary.status_line(), headline)
    return Outcome("ok", "", headline)


def restore_folder(job: Job, had_hydra: bool) -> None:
    """Recreate a job folder deleted while the job ran, with its redacted config, and say so."""
    hydra = job.output_dir / ".hydra"
    if not had_hydra or hydra.is_dir():
        return
    from omegaconf import OmegaConf

    atomic_write_text(hydra / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(dict(job.spec.resolved))))
    print(f"job folder {job.output_dir} was deleted while the job ran: made again with its results and "
          ".hydra/config.yaml (the resolved config; Hydra's overrides.yaml and hydra.yaml are lost)",
          file=sys.stderr, flush=True)


def publish(job: Job, summary: Summary, tracker: Any, spending: BudgetReport | None = None, *,
            had_hydra: bool = False) -> None:
    """Files, console report, MLflow, the run's end; ``had_hydra``: the folder had ``.hydra/`` (``restore_folder``)."""
    stopped = spending is not None and spending.stopped
    complete = summary.complete and not stopped
    outcome = job_outcome(job, summary, spending)
    restore_folder(job, had_hydra)
    published = job.work.kind.publish(job, summary, complete)
    meter = job.attempt.meter
    if job.dry_run:
        estimate = meter.totals().get("cost_usd", 0.0)
        parent = job.spec.parent_run
        sweep = parent.sweep_dir if isinstance(parent, SweepParent) else None
        show(dry_run_report(job.work.title, meter, fit_line(job.cfg.calls, estimate, sweep)), job.output_dir)
        return
    where = str(job.output_dir)
    if tracker is not None:
        tracker.wait_opened()
        where += f" | MLflow run {tracker.run_id} at {job.cfg.tracking.uri}"
        if tracker.notice:
            log.warning("MLflow: %s", tracker.notice)
    status = spending.status_line() if spending is not None and stopped else summary.status_line()
    # Printing the results, keeping them on disk and logging them is held together: an interrupt waits for it (a few
    # seconds) and is delivered once the run has ended FINISHED. Raised half-way through MLflow's store writes, it
    # could leave a SQLite transaction or a lock behind and the run RUNNING; raised once the table shows (before the
    # shield, as it began after the table), it ended a complete run KILLED.
    with shielded():
        show(published.report(where, status), job.output_dir)
        if tracker is None:
            return
        m = summary.metrics
        # the run spans every attempt: usage for the whole job (the folder's metrics.json: this attempt's)
        whole = {**m, **whole_job_usage(job.attempt.earlier, meter), **whole_job_metrics(m)}
        batch_ids = {"cupid.batch_ids": " ".join(meter.batches.ids)[:5000]} if meter.batches.ids else {}
        line = results_line(job, summary, whole, published.tags)
        tracker.finish(FinalLog(
            metrics=whole, step=summary.n_units, status=status_of(outcome.outcome),
            tags={"cupid.complete": str(complete).lower(), **published.tags, DESCRIPTION_TAG: line,
                  **outcome_tags(outcome.outcome, outcome.reason), **batch_ids},
            headline=line,
            artifacts=[([*(str(f) for f in published.files), str(job.output_dir / RESULTS_FILE)], None),
                       ([str(p) for p in sorted((job.output_dir / ".hydra").glob("*.yaml"))], ".hydra")],
            table=published.table, plots=job.work.tracking.plots if job.work.tracking is not None else None,
            # the run's traces hold each instance's replies: its copy of the records leaves them out
            without_replies=[str(p) for p in published.replies] if job.cfg.tracking.traces else [],
            summary={"calls": int(m.get("calls/total", 0)), "cost_usd": round(m.get("cost/usd", 0.0), 6)}))


RESULTS_FILE = "results.txt"  # the printed results table (or a dry run's estimate), beside metrics.json
DRY_RUN_METRICS = ("calls/", "tokens/", "cost/", "time/", "data/", "resume/", "instances/total")  # what it measures


def in_job_log(message: str, level: int = logging.INFO) -> None:
    """Write ``message`` to the job's log file only (Hydra's file handler): the console has said it already."""
    record = logging.LogRecord("cupid_exp", level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def show(text: str, output_dir: Path) -> None:
    """Print the job's closing text, then keep it in its folder (``results.txt``) and its log file."""
    print(text, flush=True)
    atomic_write_text(Path(output_dir) / RESULTS_FILE, text.strip("\n") + "\n")
    in_job_log(text.strip("\n"))


def dry_run_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """What a dry run measured (calls, tokens, cost, time, data): not the scores of its placeholder replies."""
    return {k: v for k, v in metrics.items() if k.startswith(DRY_RUN_METRICS)}


PERCENT_COLUMNS = ("precision", "recall", "f1", "micro/precision", "micro/recall", "micro/f1")
HEADERS = {"inference": "inference P/R/F1 in %: macro (paper: mean per-instance P and R, F1 = their harmonic "
                        "mean) and micro (pooled, upstream)",
           "generation": "generation: mean judge score (1-10)"}


def results_table(nested: Mapping[str, Any]) -> pd.DataFrame:
    """One row per instance group (all, then each type): n and the task's numbers."""
    rows = []
    for group, block in nested.items():
        if group == "counts":
            continue
        row: dict[str, Any] = {"instances": group, "n": block.get("n", 0)}
        row.update({k: round(100 * block[k], 1) for k in PERCENT_COLUMNS if k in block})
        if "score" in block:
            row["score (1-10)"] = round(block["score"], 2)
        rows.append(row)
    import pandas as pd

    frame = pd.DataFrame(rows).set_index("instances")
    return frame.astype(object).where(frame.notna(), "-")  # "-" in a float column: as text, not a downcast


def header(kind: str, choices: Mapping[str, str]) -> str:
    return f"CUPID {kind} | " + " ".join(f"{k}={v}" for k, v in choices.items())


def job_report(title: str, nested: Mapping[str, Any], errors: Mapping[str, int], metrics: Mapping[str, float],
               n_bad_rows: int, where: str, status: str) -> str:
    lines = ["", title]
    for part, block in nested.items():
        counts = block.get("counts", {})
        lines += [HEADERS.get(part, part), results_table(block).to_string(),
                  f"{part} instances: {counts.get('instances', 0)} run, {counts.get('scored', 0)} scored, "
                  f"{counts.get('failed', 0)} failed (policy: {counts.get('failure_policy', '-')})"]
    warnings = int(metrics.get("data/oracle_count_warnings", 0))
    lines += [
        f"bad data rows skipped: {n_bad_rows}" + (f"; oracle count warnings: {warnings}" if warnings else ""),
        "failed steps: " + (", ".join(f"{k}={v}" for k, v in sorted(errors.items()) if "/" in k) or "none"),
        usage_line(dict(metrics), metrics.get("time/seconds")),
        f"outputs: {where}",
        status,
    ]
    return "\n".join(lines)


def dry_run_report(title: str, meter: UsageMeter, budget_line: str | None = None) -> str:
    """Calls, tokens and estimated cost per step of a dry run; ``budget_line``: whether it fits the budget."""
    rows = [{"step": step, "calls": int(c.get("calls", 0)), "prompt tokens": int(c.get("prompt_tokens", 0)),
             "completion tokens (est.)": int(c.get("completion_tokens", 0)),
             "cost USD (est.)": round(c.get("cost_usd", 0.0), 4), "unpriced calls": int(c.get("unpriced_calls", 0))}
            for step, c in meter.as_dict().items()]
    totals = meter.totals()
    import pandas as pd

    table = pd.DataFrame(rows).set_index("step").to_string() if rows else "(no calls)"
    unpriced = int(totals.get("unpriced_calls", 0))
    batch = totals.get("batch_cost_usd")
    return "\n".join([
        "", f"DRY RUN (no model was called) | {title}", table,
        f"total: {int(totals.get('calls', 0))} calls, {int(totals.get('prompt_tokens', 0))} prompt tokens, "
        f"~{int(totals.get('completion_tokens', 0))} completion tokens, ~${totals.get('cost_usd', 0.0):.4f}"
        + (f" ({unpriced} calls unpriced)" if unpriced else "")
        + (f"; with calls.batch=true ~${batch:.4f} (Batch API prices where the provider has them)"
           if batch is not None and batch < totals.get("cost_usd", 0.0) else ""),
        *([budget_line] if budget_line else []),
    ])
