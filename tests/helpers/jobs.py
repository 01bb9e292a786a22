"""Run the job's phases in-process against the stub server: compose, plan, execute one instance."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conftest import compose_config

from cupid_exp.evaluation import plan, run_instance
from cupid_exp.job import Job
from cupid_exp.results import InstanceResult
from cupid_exp.testing.cupid_data import stub_overrides


def stub_config(url: str, root: Path, *overrides: str):
    return compose_config([*stub_overrides(url), f"paths.output_root={root}", "tracking=none",
                           "runtime.progress=false", *overrides])


def stub_plan(url: str, root: Path, *overrides: str) -> Job:
    return plan(stub_config(url, root, *overrides), root / "job")


def run_one(job: Job, index: int = 0) -> InstanceResult:
    return asyncio.run(run_instance(job, job.work.units[index]))
