"""A persona's files (journey, replies) written in order by a thread: each write is atomic and fsynced, which on the
event loop would stall every call. Saves during a write coalesce, the last winning; ``flushed`` waits."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cupid_exp.outputs import atomic_write_text


class FileWrites:
    """One persona's pending writes; ``flushed`` waits for them (and raises what a write raised)."""

    def __init__(self) -> None:
        self._replace: dict[Path, str] = {}  #: the latest text of each file to replace
        self._append: dict[Path, list[str]] = {}  #: lines to append, in order
        self._task: asyncio.Task | None = None

    def replace(self, path: Path, text: str) -> None:
        self._replace[path] = text
        self._start()

    def append(self, path: Path, lines: list[str]) -> None:
        if lines:
            self._append.setdefault(path, []).extend(lines)
            self._start()

    def _start(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop: now
            self._write_pending()
            return
        if self._task is None or self._task.done():
            if self._task is not None and self._task.exception() is not None:
                return  # a write failed: ``flushed`` raises it; nothing more is written
            self._task = loop.create_task(self._drain())

    async def _drain(self) -> None:
        while self._replace or self._append:
            await asyncio.to_thread(self._write_pending)

    def _write_pending(self) -> None:
        replace, self._replace = self._replace, {}
        append, self._append = self._append, {}
        for path, lines in append.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as fh:
                fh.write("".join(lines))
        for path, text in replace.items():
            atomic_write_text(path, text)

    async def flushed(self) -> None:
        """Every write asked for so far is on disk (the last one of each file)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
        if self._task is not None:
            self._task.result()
