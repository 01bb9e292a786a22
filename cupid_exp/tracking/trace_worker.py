"""The job's traces built and exported in a worker process, on another core than the job's event loop.

Building spans and MLflow's export threads writing them into the store cost several ms of CPU per model
call; in the job's process they compete with its event loop for the GIL. The worker is spawned, not
forked (the job holds SQLite connections and threads), as soon as the job's run is being opened, so its
``import mlflow`` overlaps the job's own start. It hears the run's ids once the run exists, then gets
one message per finished instance (the two fields of the instance a trace shows, its ``InstanceResult``
and its ``CallLog``, pickled on the event loop so that a failure shows up there) and writes them with
``TraceWriter``. The job never waits for it before its end; ``close`` then waits for the backlog.

Tracing never stops the job: a worker that cannot be started leaves the job tracing in its own process
(``InProcessTraces``, with a warning); one that fails or dies is reported once and the job goes on.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import queue
import signal
import time
from types import SimpleNamespace
from typing import Any, Mapping

from cupid_exp.llm.calls import CallLog
from cupid_exp.results import InstanceResult
from cupid_exp.tracking import traces

log = logging.getLogger(__name__)

STALL_S = 60.0  #: a finished job gives up on a worker that wrote nothing more for this long
ORPHAN_FLUSH_S = 30.0  #: a worker whose job process died exports what it built for at most this long


class InProcessTraces:
    """Tracing in the job's process (the fallback): ``TraceWriter`` here, MLflow's threads exporting."""

    def __init__(self, writer: traces.TraceWriter):
        self.writer = writer

    def write(self, instance: Any, result: InstanceResult, calls: CallLog) -> None:
        self.writer.write(instance, result, calls)

    def executed(self) -> None:
        traces.flush(0)

    def close(self, timeout: float | None = None) -> bool:
        done = traces.flush(timeout, terminate=True)
        if not done:
            log.warning("MLflow trace export gave up after %.0f s; traces of this attempt may be missing", timeout)
        return done


class TraceWorker:
    """The job's handle on its trace worker: ``begin`` once the run exists, ``write`` per instance, ``close``."""

    def __init__(self) -> None:
        method = multiprocessing.get_start_method(allow_none=True)
        if method not in (None, "spawn", "fork", "forkserver"):
            # a spawned child sets the parent's start method before anything else; joblib's loky workers
            # have their own ('loky'), which a bare child does not know: it would die at once
            raise RuntimeError(f"this process's start method {method!r} cannot spawn a worker")
        ctx = multiprocessing.get_context("spawn")
        self.inbox = ctx.Queue()  # its feeder thread sends: a put never waits on the worker
        self.outbox, writer = ctx.Pipe(duplex=False)  # the worker's notes: a failure, then 'closed'
        self.progress = ctx.RawValue("q", 0)  # messages the worker has handled, to tell slow from stuck
        self.process = ctx.Process(target=_serve, args=(self.inbox, writer, self.progress), name="cupid-traces",
                                   daemon=True)
        try:
            self.process.start()
        finally:
            writer.close()  # the worker holds the writing end: its death is an EOF here
        self.pid = self.process.pid
        self.stopped = False  #: no more traces go to the worker (it failed, died, or was closed)
        self.result: bool | None = None  #: what ``close`` returned

    def begin(self, uri: str, experiment_id: str, run_id: str, tags: Mapping[str, str], judges: Mapping[str, str],
              secrets: list[str]) -> None:
        self.inbox.put(("setup", {"uri": uri, "experiment_id": experiment_id, "run_id": run_id, "tags": dict(tags),
                                  "judges": dict(judges), "secrets": list(secrets)}))

    def write(self, instance: Any, result: InstanceResult, calls: CallLog) -> None:
        """On the event loop: a health check, one pickle and a queue put; never raises, never waits."""
        if self.stopped or not self._healthy():
            return
        try:
            shown = SimpleNamespace(current_request=instance.current_request,
                                    current_context_factor=instance.current_context_factor)
            self.inbox.put(("trace", pickle.dumps((shown, result, calls), protocol=pickle.HIGHEST_PROTOCOL)))
        except Exception as exc:  # noqa: BLE001  # tracing must never stop the job
            self._give_up(f"{type(exc).__name__}: {exc}")

    def executed(self) -> None:
        """Nothing to do: the worker exports as it goes."""

    def close(self, timeout: float | None = None) -> bool:
        """Wait for the backlog, then stop the worker; True when everything sent was written and exported.
        ``timeout`` None: as long as the worker makes progress (``STALL_S`` without: give up); otherwise at most
        that many seconds. A worker still running then is killed."""
        if self.result is not None:
            return self.result
        self.result = False
        try:
            if self.process.exitcode is None:
                self.inbox.put(("close",))
                self.result = self._wait_closed(timeout)
            else:
                self._healthy()
        finally:
            self._reap()
        return self.result

    def abandon(self) -> None:
        """Stop the worker now, whatever it has not written (the run could not be opened)."""
        self.result = self.result if self.result is not None else False
        self.stopped = True
        self.process.kill()
        self._reap()

    def _wait_closed(self, timeout: float | None) -> bool:
        from multiprocessing.connection import wait

        began = moved = time.monotonic()
        seen = self.progress.value
        while True:
            ready = wait([self.outbox, self.process.sentinel], 0.25)
            if self.outbox in ready:
                try:
                    note = self.outbox.recv()
                except (EOFError, OSError):
                    note = ("exited",)
                if note[0] == "closed":
                    return True
                if note[0] == "failed":
                    self._give_up(note[1])
                    continue
            if ready:  # it exited without saying it had finished
                self.process.join(1.0)
                self._give_up(f"the trace worker exited (code {self.process.exitcode})")
                return False
            now = time.monotonic()
            if self.progress.value != seen:
                seen, moved = self.progress.value, now
            if timeout is not None and now - began >= timeout or timeout is None and now - moved >= STALL_S:
                log.warning("MLflow trace export gave up after %.0f s%s; traces of this attempt may be missing",
                            now - began, "" if timeout is not None else f" ({STALL_S:.0f} s without progress)")
                return False

    def _healthy(self) -> bool:
        """Read the worker's notes and check it is alive (two cheap system calls)."""
        try:
            while not self.stopped and self.outbox.poll():
                note = self.outbox.recv()
                if note[0] == "failed":
                    self._give_up(note[1])
        except (EOFError, OSError):
            pass
        if not self.stopped and self.process.exitcode is not None:
            self._give_up(f"the trace worker exited (code {self.process.exitcode})")
        return not self.stopped

    def _give_up(self, why: str) -> None:
        if not self.stopped:
            self.stopped = True
            log.warning("MLflow tracing stopped for this job: %s", why)

    def _reap(self) -> None:
        self.stopped = True
        self.process.join(2.0)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join(5.0)
        self.inbox.cancel_join_thread()  # whatever the worker did not read is lost: never hang the job's exit on it
        self.inbox.close()
        self.outbox.close()


def start() -> TraceWorker | None:
    """A trace worker, or None (with a warning) when none can be started."""
    try:
        return TraceWorker()
    except Exception as exc:  # noqa: BLE001  # the job traces in its own process instead
        log.warning("MLflow traces are built in the job's process: no trace worker (%s: %s)", type(exc).__name__, exc)
        return None


def _serve(inbox: Any, outbox: Any, progress: Any) -> None:
    """The worker: set up, write a trace per message, export and say so at ``close`` (or when the job died)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the job decides
    # Writing traces is all this process does: MLflow's batch thread writes them to the store itself, without
    # its async queue, whose flush idles up to a second (a 1 s poll) before it returns.
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")
    logging.getLogger(traces.__name__).addHandler(logging.NullHandler())  # the job reports failures, once
    # now, while the job is still starting: what a first trace would otherwise import (a second or two)
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    import mlflow.tracing.export.mlflow_v3  # noqa: F401
    import mlflow.tracing.provider  # noqa: F401

    parent = multiprocessing.parent_process()
    writer: traces.TraceWriter | None = None
    reported = False
    while True:
        try:
            message = inbox.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                traces.flush(ORPHAN_FLUSH_S, terminate=True)
                os._exit(0)
            continue
        kind = message[0]
        if kind == "setup":
            setup = message[1]
            traces.setup(setup["uri"])
            writer = traces.TraceWriter(setup["experiment_id"], setup["run_id"], setup["tags"], setup["judges"],
                                        setup["secrets"])
        elif kind == "trace" and writer is not None:
            writer.write(*pickle.loads(message[1]))
            if writer.error and not reported:
                reported = True
                outbox.send(("failed", writer.error))
        elif kind == "close":
            if writer is not None:
                traces.flush(terminate=True)
            outbox.send(("closed",))
            os._exit(0)  # all is in the store: skip the interpreter's teardown (and MLflow's exit-time drain)
        progress.value += 1
