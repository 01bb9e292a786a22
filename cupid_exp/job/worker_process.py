"""A job's worker process: its own clients and event loop, units from a shared counter, each sent back with its calls
and usage. Exits if its job died; its environment failure is the job's (exit 5)."""

from __future__ import annotations

import asyncio
import logging
import logging.handlers
import multiprocessing
import os
import pickle
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cupid_exp.durability.signals import ignore_stops
from cupid_exp.job.heap import long_lived_frozen
from cupid_exp.job.lanes import fair_share, run_units
from cupid_exp.job.spec import Result, Unit, Work
from cupid_exp.llm.budget import Budget
from cupid_exp.llm.client import drain_background_tasks
from cupid_exp.llm.retry import FatalProviderError
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.outputs import EnvironmentFailure, environment_failure

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.sharedctypes import Synchronized
    from multiprocessing.synchronize import Event

    from cupid_exp.llm.calls import CallLog


@dataclass
class WorkerSpec:
    """What a worker needs to run units as the job would (everything checked by the job already)."""

    work: Work  #: the job's work without its units and tracking view (``Workers``)
    index: int  #: this process's among ``processes`` (its share of each model's concurrency)
    secrets: list[str]
    ledger: str | None = None  #: the job's usage ledger: this process writes its own counts into it
    budget: Budget | None = None  #: the job's spending limits (ledger files shared by every process)
    processes: int = 1  #: how many processes share the units (this one's lanes: at most its fair share)


@dataclass(frozen=True)
class Report:
    """What a worker tells the job: a finished ``unit``, ``done``, or why it stopped."""

    kind: str
    pid: int | None = None
    key: str = ""  #: the finished unit's
    result: Any = None
    calls: CallLog | None = None  #: the unit's model calls, when the job traces them
    counts: dict[str, dict[str, float]] = field(default_factory=dict)  #: usage since its last report
    cpu_seconds: float = 0.0  #: the worker's CPU time, in its last word
    error: Any = None  #: the FatalProviderError, the exception the job raises (``failed``), or how it ``died``


@dataclass
class Shared:
    """What the job and its workers share: the next unit's index, the go, and whether to send calls."""

    counter: Synchronized[int]
    go: Event
    wants_calls: Synchronized[int]
    ready: Synchronized[int]  #: workers whose clients are built (they wait for the go)


class SharedCursor:
    """Hands out the next unit left to run, across processes (a shared counter under its lock)."""

    def __init__(self, counter: Synchronized[int], units: list[Unit]):
        self.counter, self.units = counter, units

    def __call__(self) -> Unit | None:
        with self.counter.get_lock():
            index = self.counter.value
            if index >= len(self.units):
                return None
            self.counter.value = index + 1
        return self.units[index]

    def stop(self) -> None:
        """No process takes another unit (a fatal provider refusal)."""
        with self.counter.get_lock():
            self.counter.value = len(self.units)


class WorkerFailed(RuntimeError):
    """A worker process stopped on a bug or died: the job stops, as it would with the bug in its own process."""


class WorkerEnvironmentFailure(EnvironmentFailure):
    """A worker's environment failure, re-raised by the job as its own (exit 5); picklable, unlike its base."""

    def __init__(self, line: str, path: str | None, error: OSError):
        Exception.__init__(self, line)
        self.path, self.error = path, error

    @classmethod
    def of(cls, failure: EnvironmentFailure) -> "WorkerEnvironmentFailure":
        return cls(str(failure), str(failure.path) if failure.path else None,
                   OSError(failure.error.errno, failure.error.strerror, failure.error.filename))

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.path, self.error)


def _exit_with_parent() -> None:
    """A worker whose job died (SIGKILL) would otherwise run its calls for nobody and hang on a full queue."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="cupid-parent-watch", daemon=True).start()


def _connect(spec: WorkerSpec) -> tuple[Any, int, UsageMeter]:
    """This process's clients, its lanes and its meter (writing into the job's usage ledger)."""
    from cupid_exp.secrets import install_log_scrubber

    install_log_scrubber(spec.secrets)
    meter = UsageMeter()
    if spec.ledger:
        from cupid_exp.durability.ledger import UsageLedger

        meter.sink = UsageLedger(Path(spec.ledger)).append
    return (*spec.work.kind.connect(meter, spec.budget, (spec.index, spec.processes)), meter)


def serve_units(spec: WorkerSpec, shared: Shared, inbox: Queue[bytes],
                outbox: Queue[bytes | logging.LogRecord]) -> None:
    """A worker: build clients, receive units, wait for the go, then run units from the shared counter."""
    ignore_stops()  # Ctrl-C or a scheduler's SIGTERM reach the whole group: the job decides (``Workers.stop``)
    _exit_with_parent()
    root = logging.getLogger()  # its log lines go to the job's process, which writes them with its own handlers
    root.handlers = [logging.handlers.QueueHandler(outbox)]
    root.setLevel(logging.WARNING)
    logging.getLogger("cupid_exp").setLevel(logging.INFO)
    code = 0
    try:
        ctx, lanes, meter = _connect(spec)
        units = pickle.loads(inbox.get())  # every unit left; the shared counter says which is next
        with shared.ready.get_lock():
            shared.ready.value += 1
        shared.go.wait()
        sent: dict[str, dict[str, float]] = {}

        def finished(unit: Unit, result: Result, calls: CallLog | None) -> None:
            # pickled here, so that an object that cannot cross shows up as this worker's bug, not as a loss
            outbox.put(pickle.dumps(Report("unit", key=unit.key, result=result, calls=calls, counts=meter.since(sent))))

        async def run() -> None:
            await run_units(spec.work.kind, ctx, lanes, SharedCursor(shared.counter, units), finished, None,
                            bool(shared.wants_calls.value), fair_share(len(units), spec.processes))
            await drain_background_tasks()

        try:
            with long_lived_frozen():  # its clients and units, and what it inherited or imported (``job.heap``)
                asyncio.run(run())
        except FatalProviderError as exc:  # the job stops taking units and reports it
            outbox.put(pickle.dumps(Report("fatal", error=exc)))
        outbox.put(pickle.dumps(Report("done", os.getpid(), counts=meter.since(sent), cpu_seconds=time.process_time())))
    except BaseException as exc:  # noqa: BLE001 - every failure here is the job's to raise
        failure = environment_failure(exc) if isinstance(exc, Exception) else None
        # the machine's, not a bug: the job's one line (exit 5); a bug: its traceback
        error = WorkerEnvironmentFailure.of(failure) if failure is not None \
            else WorkerFailed(f"a worker process stopped on a bug:\n{traceback.format_exc()}")
        outbox.put(pickle.dumps(Report("failed", os.getpid(), error=error)))
        code = 1
    outbox.close()
    outbox.join_thread()  # everything sent is in the pipe
    os._exit(code)  # no interpreter teardown (litellm's objects: a second or more)
