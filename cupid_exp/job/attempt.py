"""What one attempt of a job opens, in one place: lock, journal, usage ledger, budget, process count. The lock comes
first, so a second process stops (exit 2) before reading anything; a dry run opens nothing."""

from __future__ import annotations

import logging

from cupid_exp.durability import job_lock
from cupid_exp.durability.journal import Journal
from cupid_exp.durability.ledger import UsageLedger
from cupid_exp.job.budgets import job_budget
from cupid_exp.job.checks import check_keys
from cupid_exp.job.spec import Attempt, JobSpec
from cupid_exp.job.worker_count import processes
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.tracking.mlflow import SweepParent

log = logging.getLogger(__name__)


def open_attempt(spec: JobSpec) -> Attempt:
    """Take the job, read what its journal holds, and open its ledger and budget (see the module docstring)."""
    cfg, work = spec.cfg, spec.work
    # raises JobRunning when another process runs the job (``durability.job_lock`` for the same calls reported
    # differently)
    lock = None if spec.dry_run else job_lock.acquire(spec.journal_dir, spec.identity, spec.run_key)
    try:
        journal, ledger, earlier, done, meter = None, None, None, {}, UsageMeter()
        if cfg.runtime.resume and not spec.dry_run:
            journal = Journal(spec.journal_dir / f"{spec.identity}.jsonl", list(spec.secrets),
                              fields=work.record_fields, final=work.final)
            finished = journal.load(retry_failed=cfg.runtime.retry_failed)
            done = {u.key: finished[u.key] for u in work.units if u.key in finished}
            ledger = UsageLedger.beside(journal.path)  # every paid request, as it returns
            earlier = ledger.load(carried=done.values())
            meter.sink = ledger.append
            if done:
                log.info("resuming: %d of %d %ss already finished (journal %s)", len(done), len(work.units),
                         work.noun, journal.path)
        left = sum(1 for u in work.units if u.key not in done)
        if left:  # a resume with nothing left calls nothing: it needs no key
            check_keys(work.roles, spec.dry_run)
        budget = None
        if not spec.dry_run:
            accounts = (journal.path.with_suffix(".budget.json") if journal is not None
                        else spec.output_dir / "budget.json")
            sweep = spec.parent_run.sweep_dir if isinstance(spec.parent_run, SweepParent) else None
            spent = earlier.totals().get("cost_usd", 0.0) if earlier is not None else 0.0
            budget = job_budget(cfg.runtime, job_ledger=accounts, sweep_dir=sweep, spent=spent)
        n = processes(cfg, left, per_process=work.units_per_process, noun=work.noun) if left and not spec.dry_run \
            else 1
        return Attempt(lock, journal, ledger, earlier, done, budget, n, meter)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
