"""A stop signal becomes an exception, and ending a run cannot be interrupted: Python dies on SIGTERM without unwinding,
leaving the MLflow run RUNNING. While a job works, ``STOP_SIGNALS`` raise ``Terminated`` (exit 128 + the signal) and
it stops as on Ctrl-C; a joblib sweep's launcher hands the signal to its workers first."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from types import FrameType
from typing import Any, Iterator

from cupid_exp.errors import Interrupted, Terminated  # noqa: F401 - raised here; defined with the other stops

SIGTERM_EXIT = 128 + signal.SIGTERM
#: signals whose default kills the process without unwinding, each a request to stop (SLURM sends SIGUSR1/SIGUSR2
#: only where ``--signal`` asks; their default, too, kills)
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")
                     if hasattr(signal, name))


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    global _STOPPED
    if _in_sweep_worker():
        if _STOPPED:  # its job stops already: a signal to the whole group reaches it, then the sweep's copy
            return
        _STOPPED = signum
    raise Terminated(signum, _stop_sweep_jobs(signum))


def ignore_stops() -> None:
    """In a job's helper process: signals sent to the process group are the job's to act on; it ends its helpers."""
    for s in (signal.SIGINT, *STOP_SIGNALS):
        signal.signal(s, signal.SIG_IGN)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside the block a stop signal raises ``Terminated`` (main thread only; elsewhere nothing changes)."""
    if not _main_thread():
        yield
        return
    global _IN_JOB
    end_with_launcher()
    if _STOPPED:  # a sweep's worker told to stop: the jobs queued to it stop too, before their runs
        raise Terminated(_STOPPED)
    # every stop signal but one the user ignores (``nohup``'s SIGHUP)
    previous = {s: signal.signal(s, _raise_terminated) for s in STOP_SIGNALS
                if s == signal.SIGTERM or signal.getsignal(s) != signal.SIG_IGN}
    if _in_sweep_worker():  # Ctrl-C reaches it from the terminal and again from the sweep's process: one stop
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _raise_terminated)
    _IN_JOB += 1
    try:
        yield
    finally:
        _IN_JOB -= 1
        for s, handler in previous.items():
            signal.signal(s, handler)


def install_sigterm_handler() -> None:
    """For a process that runs jobs: a stop signal left at its default raises ``Terminated`` (ignored ones stay
    ignored), and Ctrl-C in a joblib launcher stops its jobs first."""
    if _main_thread():
        for s in STOP_SIGNALS:
            if signal.getsignal(s) in (signal.SIG_DFL, None):
                signal.signal(s, _raise_terminated)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _interrupt)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C as KeyboardInterrupt, but a joblib launcher first stops and awaits its running jobs (exit 130)."""
    if sweep_executor() is not None and not _in_sweep_worker():
        raise Terminated(signum, _stop_sweep_jobs(signum))
    raise KeyboardInterrupt


@contextmanager
def shielded() -> Iterator[None]:
    """Hold SIGINT and the stop signals back for the block (ending a run), then deliver the first one that came."""
    if not _main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    previous = {s: signal.signal(s, hold) for s in (signal.SIGINT, *STOP_SIGNALS)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if pending:
            signal.raise_signal(pending[0])


_WATCHING_LAUNCHER = False
_IN_JOB = 0  #: ``sigterm_raises`` blocks this process is in: a job runs
_STOPPED = 0  #: in a sweep's worker: the stop signal a job of it got (every later job stops at once)
_FORWARDING = False  #: in a sweep's launching process: a stop signal is being forwarded to its jobs
LAUNCHER_GONE_GRACE_S = 8.0  #: a job told to stop gets this long to end its run before its process exits
SWEEP_STOP_GRACE_S = 20.0  #: a joblib sweep's jobs told to stop get this long to end before joblib kills them


def _in_sweep_worker() -> bool:
    """A joblib sweep's worker process: loky marks its workers with a call depth above zero."""
    loky = sys.modules.get("joblib.externals.loky.process_executor")
    return getattr(loky, "_CURRENT_DEPTH", 0) > 0


def end_with_launcher(poll_s: float = 0.5) -> None:
    """In a joblib sweep's worker, stop when the launcher dies: loky's workers outlive it and would keep sending paid
    requests. The job gets SIGTERM; the worker exits when it has stopped, or after ``LAUNCHER_GONE_GRACE_S``."""
    global _WATCHING_LAUNCHER
    if _WATCHING_LAUNCHER or not _in_sweep_worker():
        return
    _WATCHING_LAUNCHER = True
    launcher = os.getppid()

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(poll_s)
        if _IN_JOB:
            os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + LAUNCHER_GONE_GRACE_S
        while _IN_JOB and time.monotonic() < deadline:
            time.sleep(0.05)
        os._exit(SIGTERM_EXIT)

    threading.Thread(target=watch, name="cupid-launcher-watch", daemon=True).start()


def _catches(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler for ``signum`` (assume so where /proc cannot tell)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            caught = next(line for line in status if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return True
    return bool(int(caught.split()[1], 16) >> (signum - 1) & 1)


def sweep_executor() -> Any:
    """The loky executor a joblib sweep runs its jobs on, once one has started (else None)."""
    reusable = sys.modules.get("joblib.externals.loky.reusable_executor")
    return getattr(reusable, "_executor", None)


def _stop_sweep_jobs(signum: int) -> tuple[Any, ...]:
    """In a joblib launcher, hand a stop signal to the running jobs before joblib's abort SIGKILLs their workers, and
    wait (at most ``SWEEP_STOP_GRACE_S``) for them; return what each raised."""
    global _FORWARDING
    executor = sweep_executor()
    if executor is None or _FORWARDING or _in_sweep_worker():
        return ()
    _FORWARDING = True
    try:
        futures = [item.future for item in list(getattr(executor, "_pending_work_items", {}).values())]
        for future in futures:
            future.cancel()  # cancels only a job no worker has taken
        told: set[int] = set()
        deadline = time.monotonic() + SWEEP_STOP_GRACE_S
        while not all(f.done() for f in futures) and time.monotonic() < deadline:
            for pid in list(getattr(executor, "_processes", {})):  # a worker may start its job later: it is told then
                if pid not in told and _catches(pid, signal.SIGTERM):  # a job runs there (an idle one has no handler)
                    told.add(pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signum)
            time.sleep(0.05)
    finally:
        _FORWARDING = False
    return tuple(f.exception() for f in futures if f.done() and not f.cancelled()
                 and isinstance(f.exception(), Interrupted))
