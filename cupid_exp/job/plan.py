"""Phase 1 of a job: everything decided and checked before the first model call, frozen as a ``JobSpec``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from cupid_exp.config import JobConfig, moved_key
from cupid_exp.config_checks import check_known_keys, check_tree
from cupid_exp.durability import job_lock
from cupid_exp.durability.attempts import run_key
from cupid_exp.durability.journal import Journal
from cupid_exp.durability.ledger import UsageLedger
from cupid_exp.identity import job_identity
from cupid_exp.job.budgets import job_budget
from cupid_exp.job.checks import check_before_calls, check_keys, note_models
from cupid_exp.job.spec import Attempt, Job, JobSpec, Work
from cupid_exp.job.worker_count import processes
from cupid_exp.llm.budget import check_priced
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.secrets import install_log_scrubber, redact, secret_values
from cupid_exp.tracking.mlflow import SweepParent

log = logging.getLogger(__name__)

#: A kind of work's loader: its ``Work`` from the checked config (``load_evaluation``, ``load_synthesis``).
Load = Callable[[Any, Path], Work]


def typed_config(cfg: DictConfig) -> JobConfig:
    """The composed config as objects, every value checked (ConfigError names the first bad one)."""
    job_cfg: JobConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]  # a schema makes it an object
    check_known_keys(cfg, job_cfg, moved=moved_key)
    check_tree(job_cfg)
    return job_cfg


def specify(cfg: DictConfig, output_dir: Path, choices: dict[str, str] | None, parent_run: str | SweepParent | None,
            kind: Load) -> JobSpec:
    """The checked, loaded job, before anything is opened."""
    job_cfg: JobConfig = typed_config(cfg)
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)  # a DictConfig's container is a dict
    resolved = {str(k): v for k, v in container.items() if k != "hydra"}
    secrets = secret_values(resolved)
    install_log_scrubber(secrets)
    check_before_calls(job_cfg)
    check_priced(job_cfg.model_configs(), job_cfg.calls)  # a budget needs every model's price
    work = kind(job_cfg, output_dir)
    identity = job_identity(resolved, not_identity=work.not_identity, **work.digests)
    return JobSpec(cfg=job_cfg, work=work, resolved=redact(resolved), output_dir=output_dir,
                   choices=dict(choices or {}), parent_run=parent_run, secrets=tuple(secrets), identity=identity,
                   run_key=run_key(identity, job_cfg.runtime, job_cfg.paths.output_root))


def open_attempt(spec: JobSpec) -> Attempt:
    """What one attempt of a job opens: the lock first (a second process stops, exit 2, before reading anything),
    what its journal holds, its usage ledger, budget and process count; a dry run opens nothing."""
    cfg, work = spec.cfg, spec.work
    # JobRunning when another process runs the job (``durability.job_lock``)
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
            budget = job_budget(cfg.calls, job_ledger=accounts, sweep_dir=sweep, spent=spent)
        n = processes(cfg, left, per_process=work.units_per_process, noun=work.noun) if left and not spec.dry_run \
            else 1
        return Attempt(lock, journal, ledger, earlier, done, budget, n, meter)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def plan(cfg: DictConfig, output_dir: Path, choices: dict[str, str] | None = None,
         parent_run: str | SweepParent | None = None, *, kind: Load, clients: bool = True) -> Job:
    """The planned job, holding its attempt (release it: ``Job.release``); with ``clients`` its clients too."""
    spec = specify(cfg, output_dir, choices, parent_run, kind)
    job = Job(spec, open_attempt(spec))
    try:
        if clients:
            connect(job)
    except BaseException:
        job.release()
        raise
    return job


def connect(job: Job) -> None:
    """The work's clients, when some unit is left to run (this imports litellm: seconds)."""
    if job.todo and job.ctx is None:
        job.ctx, job.lanes = job.work.kind.connect(job.attempt.meter, job.attempt.budget, (0, job.attempt.processes))
        note_models(job.work.roles)  # litellm is imported now: its map says what it knows
