"""Phase 1 of a job: everything decided and checked before the first model call, frozen as a ``JobSpec``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from cupid_exp.config import JobConfig
from cupid_exp.config_checks import check_known_keys, check_tree
from cupid_exp.durability.attempts import run_key
from cupid_exp.job.attempt import open_attempt
from cupid_exp.job.checks import check_before_calls, note_models
from cupid_exp.job.identity import job_identity
from cupid_exp.job.spec import Job, JobSpec, Work
from cupid_exp.llm.budget import check_priced
from cupid_exp.secrets import install_log_scrubber, redact, secret_values
from cupid_exp.tracking.mlflow import SweepParent

log = logging.getLogger(__name__)


#: A kind of work's loader: its ``Work`` from the checked config (``load_evaluation``, ``load_synthesis``).
Load = Callable[[Any, Path], Work]


def typed_config(cfg: DictConfig) -> JobConfig:
    """The composed config as objects, every value checked (ConfigError names the first bad one)."""
    job_cfg: JobConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]  # a schema makes it an object
    check_known_keys(cfg, job_cfg)
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
    check_priced(job_cfg.model_configs(), job_cfg.runtime.call_settings())  # a budget needs every model's price
    work = kind(job_cfg, output_dir)
    identity = job_identity(resolved, not_identity=work.not_identity, **work.digests)
    return JobSpec(cfg=job_cfg, work=work, resolved=redact(resolved), output_dir=output_dir,
                   choices=dict(choices or {}), parent_run=parent_run, secrets=tuple(secrets), identity=identity,
                   run_key=run_key(identity, job_cfg.runtime, job_cfg.paths.output_root))


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
