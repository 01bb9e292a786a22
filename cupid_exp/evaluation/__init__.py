"""Evaluation: a job whose unit is a CUPID instance (``work``, ``instances``)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from cupid_exp.data.schema import Instance
from cupid_exp.errors import Outcome
from cupid_exp.evaluation.work import load_evaluation
from cupid_exp.job import Job, run_job
from cupid_exp.job import plan as plan_job
from cupid_exp.progress import Progress
from cupid_exp.results import InstanceResult
from cupid_exp.tracking.mlflow import SweepParent


def run_evaluation(cfg: DictConfig, output_dir: Path, choices: dict[str, str] | None = None,
                   parent_run: str | SweepParent | None = None) -> Outcome:
    """One evaluation job end to end (``python -m cupid_exp``); ``parent_run``: a sweep's (``job.plan``)."""
    return run_job(cfg, output_dir, choices, parent_run, kind=load_evaluation)


def plan(cfg: DictConfig, output_dir: Path, choices: dict[str, str] | None = None,
         parent_run: str | SweepParent | None = None, *, clients: bool = True) -> Job:
    return plan_job(cfg, output_dir, choices, parent_run, kind=load_evaluation, clients=clients)


async def run_instance(job: Job, instance: Instance, progress: Progress | None = None) -> InstanceResult:
    """One instance of a connected evaluation job, in-process (tests, notebooks)."""
    return await job.work.kind.run(job.ctx, instance, progress)
