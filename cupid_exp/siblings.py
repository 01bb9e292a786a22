"""Concurrent units of one job that stand or fall together: the lanes of a process, the parts of an instance.

``asyncio.gather`` leaves the others running after the first failure, and their own errors go unretrieved (a
full disk printed "unhandled exception" after the job's line). ``together`` cancels the others, waits for them
and raises the first failure; ``asyncio.TaskGroup`` would wrap it in an ``ExceptionGroup``, hiding it from the
job's exit (``outputs.environment_failure`` reads the chain).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable


async def together(*aws: Awaitable[Any]) -> list[Any]:
    """Each awaitable's result, in order; at the first failure the others are cancelled and awaited, and it is
    raised. Cancelled from outside (Ctrl-C), they are cancelled too before the cancellation goes on."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    if not tasks:
        return []
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
        if failed or any(not t.done() for t in tasks):
            await _cancel(tasks)
    if failed:
        raise failed[0].exception()  # type: ignore[misc]
    return [t.result() for t in tasks]


async def _cancel(tasks: list[asyncio.Future[Any]]) -> None:
    """Cancel what still runs and wait for all of it, each outcome retrieved (``gather`` retrieves them even when
    it is itself cancelled meanwhile)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
