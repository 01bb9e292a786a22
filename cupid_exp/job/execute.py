"""Phase 2 of a job: run every instance left to run, journal each as it finishes.

Each instance gets the setting's view once, then its task parts run concurrently on it. A step's
failure is recorded on its instance and the others go on; a bug (any exception that is not a
counted step failure) stops the job with its traceback, and the journal keeps what finished.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable

from cupid_exp.data.schema import Instance, relevant_positions
from cupid_exp.job.plan import JobPlan
from cupid_exp.llm.budget import BudgetExceeded, started_instance
from cupid_exp.llm.calls import CallLog, recording
from cupid_exp.llm.client import drain_background_tasks
from cupid_exp.llm.retry import FatalProviderError
from cupid_exp.llm.server import managed_server
from cupid_exp.llm.steps import StepFailed, Transcript
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.progress import InstanceObserver, Progress, wants_calls
from cupid_exp.results import HistoryView, InstanceResult, SettingOutput, Truth
from cupid_exp.settings.base import View
from cupid_exp.tasks import TASKS
from cupid_exp.tasks.context import TaskContext

log = logging.getLogger(__name__)


@dataclass
class Execution:
    """What the model phase produced, and what it cost in time."""

    results: list[InstanceResult]  #: fresh results, in completion order
    seconds: float = 0.0  #: wall time calling models and scoring (without start-up or logging)
    cpu_seconds: float = 0.0  #: CPU time in that phase (the orchestration cost), worker processes' included


def _truth(instance: Instance) -> Truth:
    return Truth(gt_preference=instance.current_contextual_preference, gt_checklist=list(instance.current_checklist),
                 gt_checklist_len=len(instance.current_checklist), context_factor=instance.current_context_factor)


def _history(instance: Instance, n_shown: int) -> HistoryView:
    words = sum(len(m.content.split()) for s in instance.prior_interactions for m in s.dialogue)
    return HistoryView(n_context_sessions=n_shown, relevant_positions=relevant_positions(instance),
                       n_prior_sessions=len(instance.prior_interactions), history_words=words)


async def run_instance(plan: JobPlan, instance: Instance, progress: Progress | None = None) -> InstanceResult:
    """The setting's view, then every task part on it; failed steps are recorded, never raised."""
    transcript = Transcript()
    stages = plan.setting.stages
    try:
        view: View | None = await plan.setting.view(instance, plan.ctx, transcript)
    except StepFailed as exc:
        transcript.fail(exc)
        log.warning("instance %s: %s", instance.key, exc)
        view = None
    for stage in stages:
        if progress is not None:
            progress.done(stage)
    outcomes: dict[str, object] = {}
    if view is not None:
        async def part(name: str) -> None:
            outcomes[name] = await TASKS[name].run(plan.ctx, instance, view, transcript)
            if progress is not None:
                progress.done(name)

        await asyncio.gather(*(part(name) for name in plan.parts))
    elif progress is not None:
        for name in plan.parts:
            progress.done(name)
    for error in transcript.errors:
        log.warning("instance %s: %s", instance.key, error.message)
    n_shown = len(view.positions) if view is not None else len(plan.setting.positions(instance))
    return InstanceResult(
        key=instance.key, persona_id=instance.persona_id, instance_type=instance.instance_type,
        truth=_truth(instance), history=_history(instance, n_shown),
        setting=view.output if view is not None else SettingOutput(),
        inference=outcomes.get("inference"), generation=outcomes.get("generation"),
        errors=transcript.errors, raw=transcript.raw, usage=transcript.usage)


def instances_in_flight(ctx: TaskContext) -> int:
    """How many instances run at once: twice the calls the job's models can have in flight together (each
    distinct model config's ``max_concurrency``, or its batch size with the Batch API), so that every free slot finds a call waiting. The rest wait
    unstarted: started all at once, each held its first prompt and state while it queued for a slot (the job's
    memory grew with the data set: +46 MB at 1,134 instances, concurrency 64; ``bench/scale.py``)."""
    clients = (ctx.subject, ctx.evaluator.decomposer, ctx.evaluator.matcher, ctx.evaluator.judge)
    slots = {id(c): c.slots for c in clients}  # a Batch API client takes a whole batch
    return 2 * sum(slots.values())


Taker = Callable[[], "Instance | None"]
Finished = Callable[[Instance, InstanceResult, "CallLog | None"], None]


async def run_instances(plan: JobPlan, take: Taker, finished: Finished, progress: Progress | None,
                        with_calls: bool) -> None:
    """Run instances as ``take`` hands them out, ``instances_in_flight`` at a time, and tell ``finished`` of each
    (with its model calls when ``with_calls``). ``take`` returns None when none is left. The caller drains
    litellm's background work after (``drain_background_tasks`` waits for every other task: its own too).

    A call the budget refuses ends its instance unfinished and starts no other (``stopped_by_budget``). A
    provider's fatal refusal (a bad key, an unknown model, a billing state, no endpoint) or a rate limit beyond
    the patience (``RetryLater``: exit 75) stops the taking: the instances in flight end (their calls to the
    refusing endpoint are not sent, the others' are not wasted), none of them is journaled (a resume runs them),
    and the refusal is raised once every lane has stopped."""
    stop = asyncio.Event()  # a call refused by the budget: no instance starts after it; those in flight go on
    fatal: list[FatalProviderError] = []

    async def lane() -> None:
        while not stop.is_set() and not fatal and (instance := take()) is not None:
            with recording(with_calls) as calls:  # its calls, for its trace
                started_instance()  # the budget serves older instances' calls first
                try:
                    result = await run_instance(plan, instance, progress)
                except BudgetExceeded:  # left unjournaled: a resume with a higher budget runs it
                    stop.set()
                    return
                except FatalProviderError as exc:
                    fatal.append(exc)
                    getattr(take, "stop", lambda: None)()  # other processes take no more either
                    return
            finished(instance, result, calls)

    await asyncio.gather(*(lane() for _ in range(instances_in_flight(plan.ctx))))
    if fatal:
        raise fatal[0]


def stopped_by_budget(meter: UsageMeter) -> bool:
    """Whether some process of the job was refused a call by its budget (its meter counts it, workers' merged)."""
    return meter.totals().get("not_sent_budget", 0.0) > 0


def job_finisher(plan: JobPlan, observer: InstanceObserver | None, results: list[InstanceResult]) -> Finished:
    """What the job's process does with each finished instance, whichever process ran it: journal its record,
    tell the observer (the MLflow run), keep its result."""
    def finished(instance: Instance, result: InstanceResult, calls: CallLog | None) -> None:
        record = result.to_record()
        if plan.journal is not None:
            plan.journal.append(record)
        if observer is not None:
            observer.instance_finished(instance, result, record, calls)
        results.append(result)

    return finished


def job_progress(plan: JobPlan, total: int) -> Progress:
    runtime = plan.cfg.runtime
    return Progress([*plan.setting.stages, *plan.parts], total, plan.meter, enabled=bool(runtime.progress),
                    every_s=runtime.progress_every_s)


async def _run_all(plan: JobPlan, instances: list[Instance], observer: InstanceObserver | None = None
                   ) -> list[InstanceResult]:
    progress = job_progress(plan, len(instances))
    results: list[InstanceResult] = []
    pending = iter(instances)
    try:
        await run_instances(plan, lambda: next(pending, None), job_finisher(plan, observer, results), progress,
                            wants_calls(observer))
    finally:
        progress.close()
    await drain_background_tasks()
    return results


def execute(plan: JobPlan, observer: InstanceObserver | None = None) -> Execution:
    """Run what is left to run (nothing on a complete resume), inside the evaluator's model server if any;
    ``observer`` (the MLflow run's live view) hears of each finished instance."""
    todo = plan.todo
    if not todo:
        return Execution([])
    server = plan.cfg.evaluator.server if not plan.dry_run else None
    with managed_server(server):
        start, cpu = time.perf_counter(), time.process_time()  # without a model server's start-up
        if plan.processes > 1:  # runtime.workers: started with the job (run_job), or here
            from cupid_exp.job.workers import run_spread, start_workers

            workers = plan.workers or start_workers(plan)
            try:
                results, workers_cpu = run_spread(plan, todo, observer, workers)
            finally:
                if workers is not plan.workers:
                    workers.stop()
        else:
            results, workers_cpu = asyncio.run(_run_all(plan, todo, observer)), 0.0
        return Execution(results, time.perf_counter() - start, time.process_time() - cpu + workers_cpu)
