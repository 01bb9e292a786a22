"""One persona's files: its journey file (what resume reads) and every reply it got (``persona_NNN.calls.jsonl``),
written in order by a thread: each write is atomic and fsynced, which on the event loop would stall every call."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cupid_exp.aside import set_aside
from cupid_exp.llm.calls import CallLog, CallRecord
from cupid_exp.outputs import atomic_write_text
from cupid_exp.synthesis.journey import JourneyTemplate, plan_factors
from cupid_exp.synthesis.personas import PersonaTemplate

log = logging.getLogger(__name__)


def json_object(path: Path, what: str, then: str) -> dict[str, Any] | None:
    """``path``'s JSON object, or None where there is none; one that is not (not JSON, not text, not an object) is
    set aside as the ``what`` it was, with ``then``: what the job does without it."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}")
    except ValueError as exc:
        set_aside(path, what, exc, then)
        return None
    return data


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


def attempt_line(record: CallRecord) -> dict[str, Any]:
    """One attempt, without the (long, repeated) prompt: the last message's tail says which attempt it was."""
    last = record.messages[-1]["content"] if record.messages else ""
    rejected = record.rejected
    return {"step": record.step, "attempt": record.attempt, "model": record.model, "cached": record.cached,
            "finish_reason": record.finish_reason, "seconds": round((record.ended_ns - record.started_ns) / 1e9, 2),
            "completion_tokens": record.completion_tokens, "reply": record.reply,
            "rejected": rejected.kind if rejected else None, "reason": rejected.message if rejected else None,
            "prompt_tail": last[-400:]}


class AttemptLog:
    """Appends the records of ``log`` not written yet to ``path`` (through ``writes``: off the event loop)."""

    def __init__(self, path: Path, log: CallLog | None, writes: FileWrites):
        self.path, self.log, self.written, self.writes = path, log, 0, writes

    def flush(self) -> None:
        if self.log is None or self.written >= len(self.log.calls):
            return
        new = self.log.calls[self.written:]
        self.written += len(new)
        self.writes.append(self.path, [json.dumps(attempt_line(r), ensure_ascii=False) + "\n" for r in new])


class JourneyStore:
    """One persona's journey file; every ``save`` replaces it atomically."""

    def __init__(self, path: Path, data: dict[str, Any]):
        self.path, self.data = path, data
        self.writes = FileWrites()  #: this persona's files, written off the event loop

    @classmethod
    def open(cls, directory: Path, template: PersonaTemplate, journey: JourneyTemplate, seed: int) -> "JourneyStore":
        """The persona's file as left, or a fresh one if written for another template (compared as JSON)."""
        path = directory / f"{template.key}.json"
        fresh = json.loads(json.dumps({"persona_index": template.index, "template": asdict(template),
                                       "journey": journey.to_dict(),
                                       "factor_plan": plan_factors(seed, template.index)}))
        data = json_object(path, "persona file", "that persona starts again (the response cache answers what it "
                           "asked already)")
        if data is not None:
            if all(data.get(k) == fresh[k] for k in ("template", "journey", "factor_plan")):
                return cls(path, data)
            log.warning("%s was written for another template; starting that persona again", path)
        store = cls(path, fresh)
        store.save()
        return store

    @classmethod
    def read(cls, directory: Path, key: str) -> "JourneyStore | None":
        """The persona's file as it stands, or None where there is none (or it cannot be read)."""
        path = directory / f"{key}.json"
        try:
            return cls(path, json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return None

    def save(self) -> None:
        """The file as the data is now (the text is taken here; written at once outside an event loop)."""
        self.writes.replace(self.path, json.dumps(self.data, indent=2, ensure_ascii=False) + "\n")

    def finished(self, validate: bool) -> bool:
        return self.data.get("status") == "done" and (self.data.get("validation") is not None or not validate)
