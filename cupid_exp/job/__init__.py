"""One evaluation job in four phases: plan → execute → summarise → publish.

Each phase is a function of the previous one's value, callable and testable in-process:
``plan`` checks everything it can before the first model call, ``execute`` runs the instances
left to run, ``summarize`` (``cupid_exp.scoring.summary``) computes the numbers, ``publish``
writes files, prints the table and finishes the MLflow run, which was opened right after planning
and followed the job's progress (``cupid_exp.tracking.live``).
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
from pathlib import Path

from omegaconf import DictConfig

from cupid_exp.entry import Interrupted, Outcome
from cupid_exp.job.budgets import BudgetReport, report
from cupid_exp.job.execute import Execution, execute, run_instance
from cupid_exp.job.plan import JobPlan, build_context, connect, plan, typed_config
from cupid_exp.job.publish import job_outcome, publish, start_tracking
from cupid_exp.job.workers import start_workers
from cupid_exp.results import InstanceResult
from cupid_exp.scoring.summary import JobSummary, summarize
from cupid_exp.durability.attempts import earlier_attempt_metrics, earlier_spend
from cupid_exp.tracking.mlflow import SweepParent, ends_on_error
from cupid_exp.durability.signals import sigterm_raises


def budget_report(job: JobPlan, execution: Execution) -> BudgetReport | None:
    """What a budgeted job spent, and whether its budget stopped it (None without a budget)."""
    if job.budget is None:
        return None
    return report(job.budget, len(job.todo) - len(execution.results), job.meter.totals().get("not_sent_budget", 0.0))


def summarize_job(job: JobPlan, execution: Execution, started: float) -> JobSummary:
    """The job's summary from the journal's finished records and this run's fresh ones, in dataset order."""
    fresh = {r.key: r.to_record() for r in execution.results}
    # an instance a budget left unrun has no record (it is run on resume)
    records = [r for i in job.data.instances if (r := job.done.get(i.key) or fresh.get(i.key)) is not None]
    extra = job.setting.metrics(records)
    extra.update({"resume/instances_from_journal": float(len(job.done)), "data/bad_rows": float(len(job.data.errors)),
                  "data/oracle_count_warnings": float(sum(1 for r in records if r.get("data_warnings"))),
                  "time/model_seconds": execution.seconds, "time/model_cpu_seconds": execution.cpu_seconds})
    cfg = job.cfg
    summary = summarize(records, job.parts, failure_policy=cfg.runtime.failure_policy, meter=job.meter,
                        extra_metrics=extra, seed=cfg.seed, with_intervals=not job.dry_run,
                        max_failed_fraction=cfg.runtime.max_failed_fraction)
    if not job.dry_run:  # what earlier attempts spent: every request they were answered (the usage ledger)
        summary.metrics.update(earlier_attempt_metrics(earlier_spend(job.earlier)))
    summary.metrics["time/seconds"] = time.perf_counter() - started
    return summary


# What summarising imports (pandas, numpy: ~0.3 s of CPU), loaded while models answer. Not matplotlib: its
# ~0.35 s on the same GIL slowed the model phase by as much (30 instances: 1.65 -> 1.95 s); the run worker
# draws the plots, in its own process, while this one summarises.
SUMMARY_MODULES = ("cupid_exp.scoring.bootstrap",)


def import_alongside(modules: tuple[str, ...] = SUMMARY_MODULES) -> threading.Thread:
    """Import ``modules`` on a thread while the job waits on its model calls (CPU that would otherwise idle);
    join it before using them. A failed import is left to the main thread's own import, which raises it."""
    def load() -> None:
        try:
            for name in modules:
                importlib.import_module(name)
        except Exception:  # noqa: BLE001 - re-raised where the module is used
            pass

    thread = threading.Thread(target=load, name="cupid-imports", daemon=True)
    thread.start()
    return thread


def interrupted(job: JobPlan) -> Interrupted:
    """How far an interrupted job got: its instances that its journal holds as finished (what a resume skips)."""
    total = len(job.data.instances)
    if job.dry_run:
        return Interrupted()
    if job.journal is None:
        return Interrupted(None, total)
    finished = job.journal.load(retry_failed=job.cfg.runtime.retry_failed)
    return Interrupted(sum(1 for i in job.data.instances if i.key in finished), total)


def run_job(cfg: DictConfig, output_dir: Path, choices: dict[str, str] | None = None,
            parent_run: str | SweepParent | None = None) -> Outcome:
    """Run one job end to end; the Outcome says whether it completed (and carries the headline metric)."""
    started = time.perf_counter()
    had_hydra = (output_dir / ".hydra").is_dir()  # Hydra saved the config there: a folder deleted later is said
    job = plan(cfg, output_dir, choices, parent_run, clients=False)  # holds the job from here (durability.job_lock)
    try:
        with sigterm_raises():  # from the run's creation on, SIGTERM unwinds (and ends the run KILLED)
            try:
                live = start_tracking(job)
                with ends_on_error(live):
                    # runtime.workers, then this process's clients: importing litellm while the MLflow worker
                    # opens the run (the workers wait for the first call)
                    job.workers = start_workers(job)
                    connect(job)
                    if live is not None and job.todo:  # before the first call; a complete resume waits at publish
                        live.wait_opened()
                    imports = import_alongside() if job.todo and not job.dry_run else None
                    execution = execute(job, live)
                    if live is not None:
                        live.executed()
                    if imports is not None:
                        imports.join()
                    summary = summarize_job(job, execution, started)
                    spending = budget_report(job, execution)
                    if spending is not None:
                        summary.metrics.update(spending.metrics())
                    publish(job, summary, live, spending, had_hydra=had_hydra)
            finally:
                if job.workers is not None:
                    job.workers.stop()
    except KeyboardInterrupt as exc:  # Ctrl-C: one line saying what a resume will find (``entry.hydra_entry``)
        raise interrupted(job) from exc
    finally:
        job.release()
    outcome = job_outcome(job, summary, spending)
    if outcome.outcome == "budget":
        print(outcome.reason, file=sys.stderr, flush=True)
    return outcome


__all__ = ["Execution", "InstanceResult", "JobPlan", "JobSummary", "build_context", "connect", "execute", "plan",
           "publish", "run_instance", "run_job", "start_tracking", "summarize", "summarize_job", "typed_config"]
