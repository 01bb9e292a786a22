"""One job, whatever its unit of work, in four phases: plan → execute → summarise → publish (docs/architecture.md)."""

from __future__ import annotations

import importlib
import logging
import signal
import sys
import threading
import time
from pathlib import Path

from omegaconf import DictConfig

from cupid_exp.durability.attempts import earlier_attempt_metrics, earlier_spend
from cupid_exp.durability.signals import sigterm_raises
from cupid_exp.errors import Interrupted, Outcome, Terminated
from cupid_exp.job.budgets import BudgetReport
from cupid_exp.job.heap import start_up
from cupid_exp.job.plan import Load, connect, plan, specify, typed_config
from cupid_exp.job.publish import job_outcome, publish, start_tracking
from cupid_exp.job.spec import Execution, Job, Summary
from cupid_exp.job.workers import execute, start_workers
from cupid_exp.tracking.mlflow import SweepParent, ends_on_error

log = logging.getLogger(__name__)


def budget_report(job: Job, execution: Execution) -> BudgetReport | None:
    """What a budgeted job spent, and whether its budget stopped it: when some process of the job was refused a call
    (None without a budget)."""
    budget = job.attempt.budget
    if budget is None:
        return None
    not_run, refused = len(job.todo) - len(execution.results), job.attempt.meter.totals().get("not_sent_budget", 0.0)
    return BudgetReport(budget.state(), not_run, stopped=bool(refused or budget.refused) and not_run > 0,
                        refused_calls=refused, noun=job.work.noun)


def summarize_job(job: Job, execution: Execution, started: float) -> Summary:
    """The kind's summary plus what earlier attempts spent and the time taken."""
    summary = job.work.kind.summarise(job, execution)
    if not job.dry_run:
        summary.metrics.update(earlier_attempt_metrics(earlier_spend(job.attempt.earlier)))
    summary.metrics["time/seconds"] = time.perf_counter() - started
    return summary


def import_alongside(modules: tuple[str, ...]) -> threading.Thread:
    """Import ``modules`` on a thread while the job waits on model calls (not matplotlib: it slowed the model phase).
    Join before use; a failed import is raised by the main thread's own."""
    def load() -> None:
        try:
            for name in modules:
                importlib.import_module(name)
        except Exception:  # noqa: BLE001 - re-raised where the module is used
            pass

    thread = threading.Thread(target=load, name="cupid-imports", daemon=True)
    thread.start()
    return thread


def interrupted(job: Job, signum: int = signal.SIGINT) -> Interrupted:
    """How far an interrupted job got: the units its journal holds as finished."""
    units = job.work.units
    noun = f"{job.work.noun}s"
    if job.dry_run:
        return Interrupted(noun=noun, signum=signum)
    if job.attempt.journal is None:
        return Interrupted(None, len(units), noun=noun, signum=signum)
    finished = job.attempt.journal.load(retry_failed=job.cfg.runtime.retry_failed)
    return Interrupted(sum(1 for u in units if u.key in finished), len(units), noun=noun, signum=signum)


@start_up()  # no garbage collections while it loads and plans (``job.heap``)
def run_job(cfg: DictConfig, output_dir: Path, choices: dict[str, str] | None = None,
            parent_run: str | SweepParent | None = None, *, kind: Load) -> Outcome:
    """Run one job of ``kind`` end to end; the Outcome says whether it completed (and carries its headline)."""
    started = time.perf_counter()
    had_hydra = (output_dir / ".hydra").is_dir()  # Hydra saved the config there: a folder deleted later is said
    job = plan(cfg, output_dir, choices, parent_run, kind=kind, clients=False)  # holds the job (durability.job_lock)
    workers = None
    try:
        with sigterm_raises():  # from the run's creation on, SIGTERM unwinds (and ends the run KILLED)
            try:
                live = start_tracking(job)
                with ends_on_error(live):
                    # runtime.workers, then this process's clients: importing litellm while the MLflow worker
                    # opens the run (the workers wait for the first call)
                    workers = start_workers(job)
                    connect(job)
                    if live is not None and job.todo:  # before the first call; a complete resume waits at publish
                        live.wait_opened()
                        log.info("MLflow run %s opened at %s", live.run_id, job.cfg.tracking.uri)  # follow it live
                    imports = import_alongside(job.work.summary_modules) if job.todo and not job.dry_run \
                        else None
                    execution = execute(job, live, workers)
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
                if workers is not None:
                    workers.stop()
    except (KeyboardInterrupt, Terminated) as exc:  # one line saying what a resume will find (``entry.hydra_entry``)
        raise interrupted(job, getattr(exc, "signum", signal.SIGINT)) from exc
    finally:
        job.release()
    outcome = job_outcome(job, summary, spending)
    if outcome.outcome == "budget":
        print(outcome.reason, file=sys.stderr, flush=True)
    return outcome


__all__ = ["Job", "connect", "execute", "import_alongside", "job_outcome", "plan", "publish", "run_job", "specify",
           "start_tracking", "summarize_job", "typed_config"]
