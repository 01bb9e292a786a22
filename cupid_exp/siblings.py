"""Concurrent units that stand or fall together. ``asyncio.gather`` leaves the others running and their errors
unretrieved; ``TaskGroup`` hides the failure in an ``ExceptionGroup``. ``together`` cancels, waits, raises the first."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable


async def together(*aws: Awaitable[Any]) -> list[Any]:
    """Each result in order; at the first failure (or outside cancellation) the others are cancelled and awaited."""
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
    """Cancel what still runs and wait for all of it, every outcome retrieved."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
