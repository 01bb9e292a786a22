"""Phase 2 of a job: run the units left, here and in workers, journal each, tell the MLflow run."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from cupid_exp.job.heap import long_lived_frozen
from cupid_exp.job.lanes import job_finisher, job_progress, run_units
from cupid_exp.job.spec import Execution, Job, Result
from cupid_exp.job.workers import Workers, run_spread, start_workers
from cupid_exp.llm.client import drain_background_tasks
from cupid_exp.llm.server import managed_server
from cupid_exp.progress import InstanceObserver, wants_calls


async def _run_all(job: Job, units: list[Any], observer: InstanceObserver | None = None) -> list[Result]:
    progress = job_progress(job, len(units))
    results: list[Result] = []
    pending = iter(units)
    try:
        await run_units(job.work.kind, job.ctx, job.lanes, lambda: next(pending, None),
                        job_finisher(job, observer, results), progress, wants_calls(observer))
    finally:
        progress.close()
    await drain_background_tasks()
    return results


def execute(job: Job, observer: InstanceObserver | None = None, workers: Workers | None = None) -> Execution:
    """Run what is left inside the work's model server, if any; ``observer`` hears of each finished unit."""
    todo = job.todo
    if not todo:
        return Execution([])
    assert job.ctx is not None, "connect(job) before execute (run_job does, between its workers and the run)"
    server = job.work.model_server if not job.dry_run else None
    with managed_server(server), long_lived_frozen():
        start, cpu = time.perf_counter(), time.process_time()  # without a model server's start-up
        if job.attempt.processes > 1:
            running = workers or start_workers(job)
            assert running is not None  # more than one process: start_workers starts them
            try:
                results, workers_cpu = run_spread(job, todo, observer, running)
            finally:
                if running is not workers:
                    running.stop()
        else:
            results, workers_cpu = asyncio.run(_run_all(job, todo, observer)), 0.0
        return Execution(results, time.perf_counter() - start, time.process_time() - cpu + workers_cpu)
