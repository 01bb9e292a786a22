"""A job's usage ledger: a line per ``UsageMeter`` count as it happens, so every paid request is in the spend (a kill's
in-flight ones at their worst case). Room kept beforehand (``keep_room``) takes the last lines when the disk fills."""

from __future__ import annotations

import json
import logging
import os
import weakref
from pathlib import Path
from typing import Any, Iterable, Mapping

from cupid_exp.aside import set_aside, torn
from cupid_exp.durability.journal import cut_torn_tail
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.outputs import EnvironmentFailure, writing

log = logging.getLogger(__name__)

ROOM_BYTES = 64 * 1024  #: kept for a full disk: ~400 lines, more than the calls a job has in flight
_CARRIED = ("calls", "prompt_tokens", "completion_tokens", "cost_usd", "cache_hits")  # what a journal record keeps


class UsageLedger:
    """The append-only usage lines of one job (one job identity under one output root)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.room = self.path.parent / f".{self.path.name}.room"  #: ``ROOM_BYTES`` kept for a full disk
        self._fd: int | None = None
        self._failed: EnvironmentFailure | None = None  #: the disk filled up: the job is stopping

    @classmethod
    def beside(cls, journal: Path) -> "UsageLedger":
        """The ledger of the job whose resume journal is ``journal``."""
        return cls(journal.parent / "usage" / journal.name)

    def keep_room(self) -> None:
        """Reserve ``ROOM_BYTES`` for the lines in flight when the disk fills; already too full: exit 5."""
        try:
            with writing(self.path.parent):
                self.room.parent.mkdir(parents=True, exist_ok=True)
                if self.room.exists() and self.room.stat().st_size >= ROOM_BYTES:
                    return
                fd = os.open(self.room, os.O_WRONLY | os.O_CREAT, 0o644)
                try:  # allocated, not a sparse file: the blocks are the job's until it frees them
                    if hasattr(os, "posix_fallocate"):
                        os.posix_fallocate(fd, 0, ROOM_BYTES)
                    else:
                        os.write(fd, bytes(ROOM_BYTES))
                finally:
                    os.close(fd)
        except EnvironmentFailure:
            self.room.unlink(missing_ok=True)
            raise

    def append(self, step: str, added: Mapping[str, float]) -> None:
        """One line per count; a full disk frees the kept room, then raises ``EnvironmentFailure`` once."""
        line = (json.dumps({"step": step, **added}, separators=(",", ":")) + "\n").encode()
        try:
            self._write(line)
        except EnvironmentFailure as exc:
            if self._failed is not None or not _free(self.room):
                raise
            self._failed = exc
            self._write(line)
            raise

    def _write(self, line: bytes) -> None:
        with writing(self.path):
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                weakref.finalize(self, os.close, self._fd)
            os.write(self._fd, line)

    def load(self, carried: Iterable[Mapping[str, Any]] = ()) -> UsageMeter:
        """The earlier attempts' counts as a meter (torn or bad lines skipped); with no ledger, ``carried`` journal
        records' usage becomes its first lines. Keeps the room for a full disk."""
        self.keep_room()
        meter, carried = UsageMeter(), list(carried)
        if self.path.exists():
            lines = [raw for raw in self.path.read_bytes().splitlines(keepends=True) if raw.strip() and not torn(raw)]
            if lines and not any(_count(raw) is not None for raw in lines):
                known = any(record.get("usage") for record in carried)
                set_aside(self.path, "usage ledger", f"{len(lines)} line(s), not one a usage count",
                          "it starts again from the usage of the journal's finished instances (what is known of them)"
                          if known else "what the job's earlier attempts spent is not known here (a reopened MLflow "
                          "run carries it from its progress metrics)")
        if not self.path.exists():
            self._carry(carried)
            if not self.path.exists():
                return meter
        cut_torn_tail(self.path, "usage ledger", log)  # a write cut short: the next line must start on its own
        counts = [_count(raw) for raw in self.path.read_bytes().splitlines()]
        for step, added in filter(None, counts):
            meter.merge({step: added})
        if skipped := counts.count(None):
            log.warning("usage ledger %s: skipped %d line(s) that are not usage counts", self.path.name, skipped)
        meter.charge_unsettled()  # the attempts that wrote it have ended: what they left in flight is charged
        return meter

    def _carry(self, records: Iterable[Mapping[str, Any]]) -> None:
        """The usage a journal's records kept, one line per step (a journal from before the ledger)."""
        steps: dict[str, dict[str, float]] = {}
        for record in records:
            for step, usage in (record.get("usage") or {}).items():
                into = steps.setdefault(step, {})
                for key in _CARRIED:
                    if isinstance(usage.get(key), (int, float)):
                        into[key] = into.get(key, 0.0) + usage[key]
        for step, added in steps.items():
            self.append(step, added)
        if steps:
            log.info("usage ledger %s: started from the journal's finished instances", self.path.name)


def _free(room: Path) -> bool:
    """Delete the room kept beside a ledger: whether there was some (another process may have taken it)."""
    try:
        room.unlink()
    except FileNotFoundError:
        return False
    return True


def _count(raw: bytes) -> tuple[str, dict[str, float]] | None:
    try:
        line = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(line, dict) or not isinstance(line.get("step"), str):
        return None
    step = line.pop("step")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in line.values()):
        return None
    return step, line
