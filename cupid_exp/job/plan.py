"""Phase 1 of a job: everything decided and checked before the first model call.

The config becomes typed objects once and every value is checked; the setting object, the data
(every row validated), the prompts and the resume journal are loaded; the clients are built only
when some instance is left to run (importing litellm takes seconds). Before the journal is read the
job takes its lock (``durability.job_lock``): a second process on the same job stops here, exit 2.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cupid_exp.config import RunConfig, check_known_keys, check_tree
from cupid_exp.data.loading import LoadedData, load_instances
from cupid_exp.data.schema import Instance
from cupid_exp.job.budgets import job_budget
from cupid_exp.job.checks import check_before_calls, check_keys, note_models, prompt_set, roles_called
from cupid_exp.llm.budget import check_priced
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.prompts import EVALUATION_PROMPTS, PromptSet
from cupid_exp.secrets import install_log_scrubber, redact, secret_values
from cupid_exp.settings import make_setting
from cupid_exp.settings.base import Setting
from cupid_exp.tasks import check_task_parts
from cupid_exp.tasks.context import TaskContext
from cupid_exp.durability import job_lock
from cupid_exp.durability.attempts import run_key
from cupid_exp.durability.job_lock import JobLock
from cupid_exp.durability.journal import Journal, job_identity
from cupid_exp.durability.ledger import UsageLedger
from cupid_exp.tracking.mlflow import SweepParent

log = logging.getLogger(__name__)


@dataclass
class JobPlan:
    """A job ready to run: its typed config, data, setting, prompts and what resume already has."""

    cfg: RunConfig
    resolved: dict[str, Any]  #: the resolved config as plain data (identity, MLflow params, config.yaml)
    output_dir: Path
    choices: dict[str, str]  #: Hydra's group choices (model=..., setting=...)
    parent_run: str | SweepParent | None  #: the sweep's MLflow parent run (by id, or by the sweep's folder)
    data: LoadedData
    prompts: PromptSet
    setting: Setting
    parts: tuple[str, ...]  #: the task parts to run, in order
    secrets: list[str]
    identity: str  #: hash of everything that decides the results (names the journal)
    journal: Journal | None = None
    done: dict[str, dict[str, Any]] = field(default_factory=dict)  #: key -> finished record from the journal
    meter: UsageMeter = field(default_factory=UsageMeter)
    ctx: TaskContext | None = None  #: clients and evaluator; None when nothing is left to run
    processes: int = 1  #: processes sharing the model calls (``runtime.workers``, bounded: ``job.workers``)
    workers: Any = None  #: the other processes' handle (``job.workers.Workers``), started by ``run_job``
    ledger: Any = None  #: the job's usage ledger (``durability.ledger``), with the journal; the meter writes into it
    earlier: UsageMeter | None = None  #: what the job's earlier attempts counted (the ledger); None without a journal
    budget: Any = None  #: the spending limits its calls draw on (``llm.budget.Budget``); None: no budget
    lock: JobLock | None = None  #: this process's hold on the job (``durability.job_lock``); None in a dry run

    def release(self) -> None:
        """Let another process take the job (its end; idempotent)."""
        if self.lock is not None:
            self.lock.release()

    @property
    def todo(self) -> list[Instance]:
        return [i for i in self.data.instances if i.key not in self.done]

    @property
    def dry_run(self) -> bool:
        return bool(self.cfg.runtime.dry_run)

    @property
    def prompts_digest(self) -> str:
        return self.prompts.digest(EVALUATION_PROMPTS)


def typed_config(cfg: DictConfig) -> RunConfig:
    """The composed config as objects, every value checked (ConfigError names the first bad one)."""
    run_cfg = OmegaConf.to_object(cfg)
    check_known_keys(cfg, run_cfg)
    check_tree(run_cfg)
    check_task_parts(run_cfg.task.parts)
    return run_cfg


def build_context(cfg: RunConfig, prompts: PromptSet, meter: UsageMeter, budget: Any = None) -> TaskContext:
    """Clients for every role (one per distinct model config) and the evaluator around them."""
    from cupid_exp.evaluators import Evaluator
    from cupid_exp.llm.client import clients_for, configure_litellm
    from cupid_exp.llm.steps import Reask
    from cupid_exp.rendering import matcher_examples

    calls = cfg.runtime.call_settings()  # what the clients read of runtime
    configure_litellm(calls)
    if not cfg.runtime.dry_run:
        from cupid_exp.llm._litellm import import_first_call_modules

        import_first_call_modules()
    ev = cfg.evaluator
    clients = clients_for({"subject": cfg.model, "decomposer": ev.decomposer, "matcher": ev.matcher,
                           "judge": ev.judge}, calls, meter, budget)
    retry = Reask(cfg.runtime.reask)
    examples = matcher_examples(prompts.matcher_examples()) if ev.matcher_few_shot else None
    evaluator = Evaluator(clients["decomposer"], clients["matcher"], clients["judge"], prompts,
                          matcher_prompt=ev.matcher_prompt, matcher_examples=examples,
                          max_checklist_items=ev.max_checklist_items, retry=retry)
    return TaskContext(clients["subject"], evaluator, prompts, retry)


def plan(cfg: DictConfig, output_dir: Path, choices: dict[str, str] | None = None,
         parent_run: str | SweepParent | None = None, *, clients: bool = True) -> JobPlan:
    """The checked, loaded job; with ``clients`` its model clients too (``connect``: later, see ``run_job``)."""
    run_cfg = typed_config(cfg)
    setting = make_setting(run_cfg.setting)
    setting.check_parts(run_cfg.task.parts)
    resolved = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "hydra"}
    secrets = secret_values(resolved)
    install_log_scrubber(secrets)
    prompts = prompt_set(run_cfg.prompts.dir)
    check_before_calls(run_cfg, setting, prompts, run_cfg.task.parts)
    check_priced(run_cfg.model_configs(), run_cfg.runtime.call_settings())  # a budget needs every model's price
    data = load_instances(run_cfg.data)
    identity = job_identity(resolved, dataset_digest=data.digest, prompts_digest=prompts.digest(EVALUATION_PROMPTS))
    job = JobPlan(cfg=run_cfg, resolved=redact(resolved), output_dir=output_dir, choices=dict(choices or {}),
                  parent_run=parent_run, data=data, prompts=prompts, setting=setting,
                  parts=tuple(run_cfg.task.parts), secrets=secrets, identity=identity)
    log.info("%d instances from %s (%d bad rows); model=%s evaluator=%s", len(data.instances), data.source,
             len(data.errors), run_cfg.model.name, run_cfg.evaluator.name)
    journal_dir = Path(run_cfg.paths.output_root) / "journal"
    if not job.dry_run:  # a dry run writes no journal and no run
        # raises JobRunning when another process runs the job (see durability.job_lock for the same calls reported
        # differently)
        key = run_key(identity, run_cfg.runtime, run_cfg.paths.output_root)
        job.lock = job_lock.acquire(journal_dir, identity, key)
    try:
        if run_cfg.runtime.resume and not job.dry_run:
            job.journal = Journal(journal_dir / f"{identity}.jsonl", secrets)
            finished = job.journal.load(retry_failed=run_cfg.runtime.retry_failed)
            job.done = {i.key: finished[i.key] for i in data.instances if i.key in finished}
            job.ledger = UsageLedger.beside(job.journal.path)  # every paid request, as it returns
            job.earlier = job.ledger.load(carried=job.done.values())
            job.meter.sink = job.ledger.append
            if job.done:
                log.info("resuming: %d of %d instances already finished (journal %s)", len(job.done),
                         len(data.instances), job.journal.path)
        if job.todo:  # a resume with nothing left calls nothing: it needs no key
            check_keys(roles_called(run_cfg, job.parts), job.dry_run)
        if not job.dry_run:
            ledger = (job.journal.path.with_suffix(".budget.json") if job.journal is not None
                      else output_dir / "budget.json")
            job.budget = job_budget(run_cfg.runtime, job_ledger=ledger,
                                    sweep_dir=parent_run.sweep_dir if isinstance(parent_run, SweepParent) else None)
        if job.todo and not job.dry_run:
            from cupid_exp.job.workers import processes

            job.processes = processes(run_cfg, len(job.todo))
        if clients:
            connect(job)
    except BaseException:
        job.release()
        raise
    return job


def connect(job: JobPlan) -> None:
    """The model clients, when some instance is left to run (this imports litellm: seconds)."""
    if job.todo and job.ctx is None:
        from cupid_exp.job.workers import share

        job.ctx = build_context(share(job.cfg, 0, job.processes), job.prompts, job.meter, job.budget)
        note_models(roles_called(job.cfg, job.parts))  # litellm is imported now: its map says what it knows
