"""Interrupts a run can survive: SIGTERM becomes an exception, and ending a run cannot be interrupted.

Python dies on SIGTERM without unwinding, so a job stopped by ``kill``, a scheduler or a container
runtime would leave its MLflow run RUNNING for ever. While a job works, SIGTERM raises ``Terminated``
instead (a ``SystemExit`` with code 143, so Hydra lets it through and the process exits as killed
processes do); the run then ends KILLED like on Ctrl-C. While the run is being ended, further
SIGINT/SIGTERM are held back and delivered afterwards.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

SIGTERM_EXIT = 128 + signal.SIGTERM


class Terminated(SystemExit):
    """SIGTERM arrived: stop like Ctrl-C does, then exit 143."""

    def __init__(self) -> None:
        super().__init__(SIGTERM_EXIT)


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside the block SIGTERM raises ``Terminated`` (main thread only; elsewhere nothing changes)."""
    if not _main_thread():
        yield
        return
    end_with_launcher()
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def install_sigterm_handler() -> None:
    """For a process that runs jobs until it exits (a sweep's launcher): SIGTERM raises ``Terminated``."""
    if _main_thread() and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _raise_terminated)


@contextmanager
def shielded() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back for the block (ending a run), then deliver the first one that came."""
    if not _main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        pending.append(signum)

    previous = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if pending:
            signal.raise_signal(pending[0])


_WATCHING_LAUNCHER = False
LAUNCHER_GONE_GRACE_S = 10.0  #: a job told to stop gets this long to end its run before its process exits


def _in_sweep_worker() -> bool:
    """A joblib sweep's worker process: loky marks its workers with a call depth above zero."""
    loky = sys.modules.get("joblib.externals.loky.process_executor")
    return getattr(loky, "_CURRENT_DEPTH", 0) > 0


def end_with_launcher(poll_s: float = 0.5) -> None:
    """In a joblib sweep's worker, stop when the sweep's own process dies (kill -9, the OOM killer).

    loky's workers outlive a killed launcher: an idle one waits minutes for work, a busy one runs its job to the
    end, sending paid requests nobody will read. Once the launcher is gone the worker gets SIGTERM (a job in it
    stops as on ``kill``: journal kept, run ended KILLED) and exits after ``LAUNCHER_GONE_GRACE_S`` regardless.
    Started once per process; elsewhere (a plain command, a sequential sweep) it does nothing.
    """
    global _WATCHING_LAUNCHER
    if _WATCHING_LAUNCHER or not _in_sweep_worker():
        return
    _WATCHING_LAUNCHER = True
    launcher = os.getppid()

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(LAUNCHER_GONE_GRACE_S)
        os._exit(SIGTERM_EXIT)

    threading.Thread(target=watch, name="cupid-launcher-watch", daemon=True).start()
