"""Resume: finished instances are appended to a journal keyed by the job's identity, so a rerun skips them. Lines are
written whole and fsynced off the event loop (``_Syncer``); torn or partial lines are skipped, and a journal without
a whole record is set aside (``cupid_exp.aside``)."""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import logging
import mmap
import os
import threading
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Mapping

from cupid_exp.aside import set_aside, torn
from cupid_exp.outputs import EnvironmentFailure, writing
from cupid_exp.results import HistoryView, Truth
from cupid_exp.secrets import scrub_obj

log = logging.getLogger(__name__)

# A record failed only for these reasons is re-run on resume; other failures (unparseable replies,
# context too long) are deterministic and stay as they are unless ``runtime.retry_failed=true``.
TRANSIENT_KINDS = {"provider", "timeout", "rate_limit", "auth"}
#: What every record ``InstanceResult.to_record`` writes carries, with its type (the truth and history fields too:
#: scoring and the table read them for failed instances as well).
RECORD_FIELDS: dict[str, type | tuple[type, ...]] = {
    "key": str, "persona_id": str, "instance_type": str, "errors": list, "usage": dict,
    **{f.name: object for cls in (Truth, HistoryView) for f in fields(cls)}}


def whole_record(record: Any, fields: Mapping[str, type | tuple[type, ...]] = RECORD_FIELDS) -> str | None:
    """Why a parsed line is not a whole record with ``fields`` (default: an evaluated instance's); None when it is."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not a record"
    missing = [name for name in fields if name not in record]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return "missing " + ", ".join(missing[:3]) + more
    wrong = [name for name, kind in fields.items() if not isinstance(record[name], kind)]
    if wrong:
        return "wrong type for " + ", ".join(wrong)
    if not all(isinstance(err, dict) and isinstance(err.get("kind"), str) for err in record["errors"]):
        return "an error entry without its kind"
    return None


def is_final(record: Mapping[str, Any], retry_failed: bool = False) -> bool:
    """Whether a record stands on resume: failures rerun, unusable replies only with ``runtime.retry_failed``."""
    errors = record.get("errors", [])
    return not errors if retry_failed else not any(err.get("kind") in TRANSIENT_KINDS for err in errors)


class _Syncer:
    """The journals' fsyncs on a thread: ``request`` after a write, ``wait`` until everything written is on disk."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Nothing pending and no thread: a new syncer, or a forked child's (its parent's lines are the parent's)."""
        self._changed = threading.Condition()
        self._wanted: dict[Path, int] = {}  #: per journal, the lines written
        self._synced: dict[Path, int] = {}  #: ... and those on disk
        self._errors: dict[Path, OSError] = {}
        self._thread: threading.Thread | None = None

    def request(self, path: Path) -> None:
        with self._changed:
            self._wanted[path] = self._wanted.get(path, 0) + 1
            if self._thread is None or not self._thread.is_alive():  # the first, or a forked child's
                self._thread = threading.Thread(target=self._run, name="cupid-journal-fsync", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def error(self, path: Path) -> OSError | None:
        """An fsync of ``path`` that failed (a disk error): raised by the journal's next append."""
        with self._changed:
            return self._errors.pop(path, None)

    def wait(self, path: Path | None = None) -> None:
        """Until ``path``'s (or every) written line is synced, or the thread died (so the exit cannot hang)."""
        with self._changed:
            while not all(self._synced.get(p, 0) >= n for p, n in self._wanted.items()
                          if path in (None, p) and p not in self._errors):
                if self._thread is None or not self._thread.is_alive():
                    return
                self._changed.wait(1.0)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: any(self._synced.get(p, 0) < n for p, n in self._wanted.items()))
                due = {p: n for p, n in self._wanted.items() if self._synced.get(p, 0) < n}
            for path, written in due.items():
                try:
                    with open(path, "rb") as fh:
                        os.fsync(fh.fileno())
                except FileNotFoundError:  # deleted: its next append says so (``JournalGone``)
                    pass
                except OSError as exc:
                    with self._changed:
                        self._errors[path] = exc
                with self._changed:
                    self._synced[path] = written
                    self._changed.notify_all()


_SYNCER = _Syncer()
atexit.register(_SYNCER.wait)  # a job's last lines are on disk before its process ends
os.register_at_fork(after_in_child=_SYNCER.reset)  # no lock the parent's thread held at the fork


def cut_torn_tail(path: Path, what: str, logger: logging.Logger = log) -> None:
    """Drop a last line without newline, so the next append does not glue onto it (``what``: the file, in the warning
    ``logger`` gives)."""
    with path.open("rb+") as fh:
        if fh.seek(0, os.SEEK_END) == 0:  # mmap cannot map an empty file
            return
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            size, keep = len(data), data.rfind(b"\n") + 1
        if keep == size:
            return
        logger.warning("%s %s: dropping a torn last line (%d bytes)", what, path.name, size - keep)
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())


class JournalGone(EnvironmentFailure):
    """The journal was deleted while the job ran: the line must not claim it keeps what finished."""

    def __init__(self, path: Path, held: int):
        error = OSError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        lost = (f"the {held} finished instances it held are no longer journalled" if held
                else "it held no finished instance yet")
        Exception.__init__(self, f"environment failure: {path}: the journal was deleted while the job ran [ENOENT]; "
                                 f"{lost}: the same command runs them again (the calls the response cache kept are "
                                 "answered from it, at no cost)")
        self.path, self.error = path, error


class Journal:
    """A job's finished units, one record a line; ``fields`` and ``final`` are the unit kind's."""

    def __init__(self, path: Path, secrets: list[str] | None = None, *,
                 fields: Mapping[str, type | tuple[type, ...]] = RECORD_FIELDS,
                 final: Callable[[Mapping[str, Any], bool], bool] = is_final):
        self.path, self.secrets = path, list(secrets or [])
        self.fields, self.final = fields, final
        self._tail_checked = False
        self.held = 0  #: the records the file held (loaded, then appended): what a deleted journal lost
        self._failed: Exception | None = None  #: the environment failure of an append: later ones fail alike
        path.parent.mkdir(parents=True, exist_ok=True)

    def load(self, retry_failed: bool = False) -> dict[str, dict[str, Any]]:
        """Finished records by key, later whole records win; bad lines are skipped with a warning."""
        done: dict[str, dict[str, Any]] = {}
        if not self.path.exists():
            return done
        unread = self._unreadable()
        if unread:
            set_aside(self.path, "journal", f"{unread} line(s), not one a whole record",
                      "its instances run again (the calls the response cache kept are answered from it)")
            return done
        cut_torn_tail(self.path, "journal")
        self._tail_checked = True
        with self.path.open("rb") as fh:
            for raw in fh:
                try:
                    record = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    log.warning("journal %s: skipping a torn line", self.path.name)
                    continue
                why = whole_record(record, self.fields)
                if why is not None:
                    log.warning("journal %s: skipping a line that is not a whole record (%s)", self.path.name, why)
                    continue
                done[record["key"]] = record
        self.held = len(done)
        return {k: r for k, r in done.items() if self.final(r, retry_failed)}

    def _unreadable(self) -> int:
        """Lines of a journal with bytes but no whole record (0 if it has one, or only a torn tail)."""
        lines = 0
        with self.path.open("rb") as fh:
            for raw in fh:
                if not raw.strip() or torn(raw):
                    continue
                lines += 1
                with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError):
                    if whole_record(json.loads(raw), self.fields) is None:
                        return 0
        return lines

    def append(self, record: dict[str, Any]) -> None:
        """One whole line, fsynced soon after; a full disk raises ``EnvironmentFailure``, then on every later append."""
        if self._failed is not None:
            raise self._failed
        try:
            if self.held and not self.path.exists():  # deleted: appending would start a new, nearly empty one
                raise JournalGone(self.path, self.held)
            try:
                self._append(record)
            except EnvironmentFailure as exc:
                if isinstance(exc.error, OSError) and exc.error.errno == errno.ENOENT:  # its folder went
                    raise JournalGone(self.path, self.held) from exc
                raise
            self.held += 1
        except EnvironmentFailure as exc:
            self._failed = exc
            raise

    def sync(self) -> None:
        """Wait until every line appended so far is on disk (the process's exit waits for it too)."""
        _SYNCER.wait(self.path)

    def _append(self, record: dict[str, Any]) -> None:
        if not self._tail_checked:
            if self.path.exists():
                cut_torn_tail(self.path, "journal")
            self._tail_checked = True
        line = (json.dumps(scrub_obj(record, self.secrets), ensure_ascii=False) + "\n").encode()
        with writing(self.path):
            failed = _SYNCER.error(self.path)
            if failed is not None:  # an earlier line's fsync: the disk may not have kept it
                raise failed
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view):]
                _SYNCER.request(self.path)
            except OSError:  # a full disk may have taken part of the line: cut it, so the journal stays whole lines
                with contextlib.suppress(OSError):  # else the next load cuts it
                    cut_torn_tail(self.path, "journal")
                raise
            finally:
                os.close(fd)
