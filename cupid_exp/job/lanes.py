"""The lanes a process runs units in. A fatal refusal or ``RetryLater`` stops the taking and is raised once every lane
stopped (in-flight units unjournalled); any other exception cancels the others (``together``)."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Iterable

from cupid_exp.job.spec import Job, Kind, Result, Unit
from cupid_exp.llm.budget import BudgetExceeded, started_instance
from cupid_exp.llm.calls import CallLog, recording
from cupid_exp.llm.retry import FatalProviderError
from cupid_exp.progress import InstanceObserver, Progress

Taker = Callable[[], Any]  #: the next unit left to run, or None
Finished = Callable[[Any, Result, "CallLog | None"], None]


async def together(*aws: Awaitable[Any]) -> list[Any]:
    """Each result in order; at the first failure (or outside cancellation) the others are cancelled and awaited and
    the failure raised as it is (``gather`` leaves the others running, ``TaskGroup`` hides it in an ExceptionGroup)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    if not tasks:
        return []
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
        if failed or any(not t.done() for t in tasks):
            for task in tasks:  # what still runs is cancelled, and all of it awaited, every outcome retrieved
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    if failed:
        raise failed[0].exception()  # type: ignore[misc]
    return [t.result() for t in tasks]


def pool_slots(clients: Iterable[Any]) -> int:
    """The calls ``clients``' pools take at once together (each pool once): what ``connect`` sizes lanes by."""
    slots: dict[int, int] = {}
    for client in clients:
        slots[id(client.pool)] = max(slots.get(id(client.pool), 0), client.slots)
    return sum(slots.values())


def fair_share(units: int, processes: int) -> int | None:
    """The most units one of ``processes`` runs at once (None: one process), so no process idles another's slots."""
    return None if processes <= 1 else max(1, -(-units // processes))


async def run_units(kind: Kind, ctx: Any, lanes: int, take: Taker, finished: Finished, progress: Progress | None,
                    with_calls: bool, at_most: int | None = None) -> None:
    """Run units as ``take`` hands them out, ``lanes`` (and ``at_most``) at a time; the caller drains litellm after."""
    stop = asyncio.Event()  # a call refused by the budget: no unit starts after it; those in flight go on
    fatal: list[FatalProviderError] = []

    async def lane() -> None:
        while not stop.is_set() and not fatal and (unit := take()) is not None:
            with recording(with_calls) as calls:  # its calls, for its trace
                started_instance()  # the budget serves older units' calls first
                try:
                    result = await kind.run(ctx, unit, progress)
                except BudgetExceeded:  # left unjournaled: a resume with a higher budget runs it
                    stop.set()
                    return
                except FatalProviderError as exc:
                    fatal.append(exc)
                    getattr(take, "stop", lambda: None)()  # other processes take no more either
                    return
            finished(unit, result, calls)

    lanes = max(1, lanes if at_most is None else min(lanes, at_most))
    await together(*(lane() for _ in range(lanes)))  # a bug or a full disk: all stop
    if fatal:
        raise fatal[0]


def job_finisher(job: Job, observer: InstanceObserver | None, results: list[Result]) -> Finished:
    """Journal each finished unit, tell the observer, keep its result, whichever process ran it."""
    journal = job.attempt.journal

    def finished(unit: Unit, result: Result, calls: CallLog | None) -> None:
        record = result.to_record()
        if journal is not None:
            journal.append(record)
        if observer is not None:
            observer.instance_finished(unit, result, record, calls)
        results.append(result)

    return finished


def job_progress(job: Job, total: int) -> Progress:
    runtime = job.cfg.runtime
    return Progress(list(job.work.stages), total, job.attempt.meter, enabled=bool(runtime.progress),
                    every_s=runtime.progress_every_s, noun=f"{job.work.noun}s")
