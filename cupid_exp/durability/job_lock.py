"""One process per job: a lock beside the journal from planning to the end. A second process stops before its first call
naming the holder (exit 2). The lock dies with its process, so the attempt after a SIGKILL takes over."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cupid_exp.errors import InputError
from cupid_exp.outputs import atomic_write_text

if TYPE_CHECKING:
    from filelock import FileLock

log = logging.getLogger(__name__)

_HELD: dict[str, "JobLock"] = {}  #: the job locks this process holds, by lock file


class JobRunning(InputError):
    """Another live process holds the job: one line, exit 2."""


class JobLock:
    """The held lock of one job; ``release`` (idempotent) when the job ends."""

    def __init__(self, path: Path, lock: FileLock | None):
        self.path, self._lock = path, lock

    def release(self) -> None:
        if self._lock is not None:
            _HELD.pop(str(self.path), None)
            self.holder_file(self.path).unlink(missing_ok=True)
            self._lock.release()
            self._lock = None

    @staticmethod
    def holder_file(path: Path) -> Path:
        return path.with_name(path.name + ".holder.json")


def lock_path(journal_dir: Path, identity: str) -> Path:
    return journal_dir / f"{identity}.lock"


def acquire(journal_dir: Path, identity: str, run_key: str) -> JobLock:
    """Hold ``identity``'s journal for ``run_key``: another live holder of the same run key raises ``JobRunning`` at
    once; of another run key, wait. A lock this process holds already is returned as it is."""
    from filelock import FileLock, Timeout

    path = lock_path(journal_dir, identity)
    if str(path) in _HELD:  # released locks leave it (``JobLock.release``)
        return _HELD[str(path)]
    journal_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), thread_local=False)  # released by whichever thread ends the run
    try:
        lock.acquire(timeout=0)
    except Timeout:
        holder = _wait_for_holder(path)
        if holder is None or holder.get("run_key") == run_key:
            raise JobRunning(running_message(path, holder)) from None
        log.warning("waiting for %s, which makes this job's calls for another report of them (run key %s): this "
                    "one replays its journal after it", describe(holder), holder.get("run_key"))
        lock.acquire()
    try:
        before = _holder(path)
        if before is not None:
            log.warning("taking over this job from %s, which no longer holds it (it died or was killed): resuming",
                        describe(before))
        atomic_write_text(JobLock.holder_file(path), json.dumps(
            {"pid": os.getpid(), "host": socket.gethostname(), "run_key": run_key,
             "since": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")}))
    except BaseException:
        lock.release()
        raise
    job = _HELD[str(path)] = JobLock(path, lock)
    return job


def running_message(path: Path, holder: dict[str, Any] | None) -> str:
    """The one line a second process prints."""
    who = describe(holder) if holder is not None else "a process that has not said which it is yet"
    return (f"another process is running this job: {who} (lock {path}); let it finish, or stop it and run this "
            "command again to resume")


def _wait_for_holder(path: Path, seconds: float = 2.0) -> dict[str, Any] | None:
    """Who holds ``path`` (it writes that just after it took the lock: asked again for a moment)."""
    deadline = time.monotonic() + seconds
    while True:
        holder = _holder(path)
        if holder is not None and _alive(holder):
            return holder
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def _alive(holder: dict[str, Any]) -> bool:
    """False for a holder on this host whose process is gone (a dead holder's note, before the new one's)."""
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(holder.get("pid", 0)), 0)
    except ProcessLookupError:
        return False
    except (OSError, ValueError):
        return True
    return True


def describe(holder: dict[str, Any]) -> str:
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('since', '?')}"


def _holder(path: Path) -> dict[str, Any] | None:
    try:
        holder = json.loads(JobLock.holder_file(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None
