"""The job's MLflow run, kept by a worker process beside the job (docs/mlflow.md, "Where MLflow runs").

Everything MLflow costs (its import, opening the run, a trace per instance, progress points, the final metrics,
artifacts, table and plots) happens on another core than the job's event loop, and the job's process never
imports MLflow. The worker is spawned, not forked (the job holds threads). The job pickles each finished
instance on its event loop, so that an object that cannot cross fails there; a thread sends the usage totals
between them (``pulse``: a synthesis persona takes minutes of calls). If the worker dies the job's process
finishes the run itself; a store that cannot be reached, or that shows no progress for
``tracking.flush_timeout_s`` once the results are printed, ends the job with exit 5 (``TrackingUnavailable``).
In a sweep the worker outlives its job and serves this process's next one, MLflow already imported.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import pickle
import threading
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Callable, Mapping, NamedTuple, Sequence

from cupid_exp.config import TrackingConfig
from cupid_exp.durability.attempts import Claim
from cupid_exp.errors import first_line
from cupid_exp.llm.calls import CallLog
from cupid_exp.progress import Totals, read_totals
from cupid_exp.results import InstanceResult
from cupid_exp.tracking.live import FinalLog, LiveRun, RunRequest
from cupid_exp.tracking.run_worker_process import SnapshotMeter, serve
from cupid_exp.tracking.store_errors import TrackingError, TrackingUnavailable, store_unreachable
from cupid_exp.tracking.traces import trace_input

if TYPE_CHECKING:
    from ctypes import c_longlong
    from multiprocessing.connection import Connection
    from multiprocessing.queues import Queue

    from cupid_exp.tracking.sweep import SweepEnd

log = logging.getLogger(__name__)

STALL_S = 60.0  #: the job gives up on a worker that handled nothing for this long while it waits
OPEN_S = 120.0  #: how long the job waits for its run to open (the store answered the checks already)
INTERRUPTED_WAIT_S = 30.0  #: how long a failed or interrupted job waits for its run to end
PULSE_MIN_S = 0.25  #: the job's usage totals go to the worker at most this often


class Pipes(NamedTuple):
    """A run worker's channels."""

    inbox: Queue[object]  #: its feeder thread sends: a put never waits on the worker
    notes: Connection  #: what the worker says (the reading end)
    handled: c_longlong  #: a shared count of the messages the worker has handled, to tell slow from stuck


class RunWorker:
    """The job's handle on its run worker; the same interface as ``LiveRun`` for the job's phases."""

    def __init__(self, keep: bool = False) -> None:
        method = multiprocessing.get_start_method(allow_none=True)
        if method not in (None, "spawn", "fork", "forkserver"):
            # a spawned child sets the parent's start method before anything else; joblib's loky workers
            # have their own ('loky'), which a bare child does not know: it would die at once
            raise RuntimeError(f"this process's start method {method!r} cannot spawn a worker")
        ctx = multiprocessing.get_context("spawn")
        notes, writer = ctx.Pipe(duplex=False)
        self.pipes = Pipes(ctx.Queue(), notes, ctx.RawValue("q", 0))
        self.process = ctx.Process(target=serve, args=(self.pipes.inbox, writer, self.pipes.handled),
                                   name="cupid-mlflow", daemon=True)
        try:
            self.process.start()
        finally:
            writer.close()  # the worker holds the writing end: its death is an EOF here
        self._begin(keep)

    def _begin(self, keep: bool) -> None:
        """A new job's state (a worker kept from the sweep's previous job is reused)."""
        self.keep = keep  #: a finished run leaves the worker to this process's next job
        self.request: RunRequest | None = None
        self.claim: Claim | None = None
        self.meter: Totals | None = None
        self.run_id: str | None = None
        self.attempt = "1"
        self.notice: str | None = None  #: what the worker found when it opened the run, for the job to say
        self.reused = False  #: the job was done and its run, which finished earlier, is left as it was
        self.stopped = False  #: nothing more goes to the worker (it failed, died, or the run ended)
        self.ended = False
        self._sending = threading.Lock()  #: usage totals reach the worker in the order they were read
        self._pulse_stop = threading.Event()

    # -- opening ---------------------------------------------------------------------------------------------
    def open(self, request: RunRequest, claim: Claim, meter: Totals) -> None:
        """Ask for the run to be opened; returns at once (``wait_opened`` waits)."""
        self.request, self.claim, self.meter = request, claim, meter
        self.pipes.inbox.put(("open", request))
        self._pulse(max(PULSE_MIN_S, request.tracking.progress_every_s / 2))

    def wait_opened(self) -> None:
        if self.run_id is not None:
            return
        note = self._wait("opened", OPEN_S)
        if note is None or note[0] != "opened":
            failed = note is not None and note[0] == "failed"
            alive = not failed and self.process.exitcode is None
            why = note[1] if failed else f"no answer within {OPEN_S:g} s" if alive else self._gone()
            self.stopped = True
            uri = self.request.tracking.uri
            if note[2] if failed else alive:  # the store, or no answer from it
                raise TrackingUnavailable(f"the MLflow store at {uri} could not open the job's run ({why}); no "
                                          "model was called for it: run the same command again once it answers")
            raise TrackingError(f"the MLflow run could not be opened at {uri}: {why}")
        self._note(note)

    # -- while the job works ---------------------------------------------------------------------------------
    @property
    def wants_calls(self) -> bool:
        return self.request is not None and self.request.traces is not None

    def instance_finished(self, instance: object, result: InstanceResult, record: object,
                          calls: CallLog | None) -> None:
        """On the event loop: a health check, one pickle and a queue put; never waits on the worker. The record
        is not sent: it is ``result.to_record()``, which the worker makes again."""
        if not self._healthy():
            return
        shown = trace_input(instance, result)  # what its trace shows of it (the rest of the instance stays here)
        with self._sending:
            self.pipes.inbox.put(("instance", self.meter.totals(),
                            pickle.dumps((shown, result, calls), protocol=pickle.HIGHEST_PROTOCOL)))

    def _pulse(self, every_s: float) -> None:
        """Send the job's usage totals every ``every_s`` seconds while they change, from a thread, until the run
        ends (``_quiet``): the worker's progress points move while calls go out, not only when a unit finishes."""
        stop = self._pulse_stop = threading.Event()

        def run() -> None:
            sent = None
            while not stop.wait(every_s):
                with self._sending:
                    if stop.is_set() or self.stopped:
                        return
                    totals = read_totals(self.meter)  # (read while the event loop adds to it: retried)
                    if totals and totals != sent:
                        self.pipes.inbox.put(("totals", totals))
                        sent = totals

        threading.Thread(target=run, name="cupid-mlflow-pulse", daemon=True).start()

    def _quiet(self) -> None:
        """No more totals from the pulse (the run's end, or no worker): none is sent after this returns."""
        with self._sending:
            self._pulse_stop.set()

    def executed(self) -> None:
        if self._healthy():
            with self._sending:
                self.pipes.inbox.put(("executed", self.meter.totals()))

    # -- the end -----------------------------------------------------------------------------------------------
    def finish(self, final: FinalLog) -> None:
        """Log the results and end the run; waits while the worker works (its trace backlog first), at most
        ``tracking.flush_timeout_s`` without a sign of progress. A store that cannot be reached, or does not answer
        in that time, is ``TrackingUnavailable`` (exit 5): its results wait in the journal for the next command."""
        if self.ended:
            return
        self._quiet()
        final.totals = self.meter.totals()
        note = self._ask(("finish", final.totals, final, self.keep), self._flush_s, stall=True)
        self.ended = True
        try:
            if note is not None and note[0] == "failed":
                if note[2]:  # the store: not asked again from here
                    raise self._unavailable(note[1])
                self._bounded(lambda: self._here(final.totals).end("FAILED"), "end the run FAILED", quiet=True)
                raise TrackingError(f"MLflow logging failed: {note[1]}")
            if note is None:
                if self.process.exitcode is None:  # alive, but no answer: the store it waits on
                    raise self._unavailable(f"no answer within {self._flush_s:g} s")
                self._bounded(lambda: self._here(final.totals).finish(final), "finish the run")  # the worker died
        finally:
            if self.keep and note is not None and note[0] == "finished":
                self._park()
            else:
                self._release()

    def end(self, status: str, summary: Mapping[str, object] | None = None, tags: dict[str, str] | None = None) -> None:
        """End the run with ``status`` and the outcome ``tags`` (a failed or interrupted job), waiting a bounded
        time; a worker that died leaves it to this process (bounded too), one that does not answer to the next
        attempt (``tracking.attempt_runs``)."""
        if self.ended:
            return
        self.ended = True
        self._quiet()
        try:
            if self.run_id is None and not self.stopped:  # opening may still be under way: let it finish
                with contextlib.suppress(TrackingError):
                    self.wait_opened()
            if self.run_id is None:  # never opened: nothing to end
                return
            note = self._ask(("end", status, summary, self.meter.totals(), tags), INTERRUPTED_WAIT_S)
            if note is not None and note[0] == "finished":
                return
            if note is not None and note[2]:  # the store failed the worker
                raise self._unavailable(note[1], "the run's end")
            if note is None and self.process.exitcode is None:
                raise self._unavailable(f"no answer within {INTERRUPTED_WAIT_S:g} s", "the run's end")
            self._bounded(lambda: self._here(self.meter.totals()).end(status, summary, tags), f"end the run {status}")
        finally:
            self._release()

    def abandon(self) -> None:
        """Stop the worker now (the run could not be requested)."""
        self.ended = self.stopped = True
        self._quiet()
        self.process.kill()
        self._release()

    # -- a sweep's parent run -----------------------------------------------------------------------------------
    def open_sweep(self, tracking: TrackingConfig, sweep_dir: str, overrides: Sequence[str] = ()) -> None:
        """Have the sweep's parent run opened (``tracking.mlflow.ensure_parent``) while the first job starts; returns
        at once. The worker then waits for that job, which takes it; a failure reaches the job that does."""
        self.pipes.inbox.put(("sweep", tracking, sweep_dir, list(overrides)))
        self._park()

    def close_sweep(self, end: SweepEnd) -> tuple[bool, str | None]:
        """Log the sweep's leaderboard on its parent run and end it (``tracking.sweep.finish_sweep``), here where
        MLflow and matplotlib are imported already; then the worker exits. Returns (done, why the leaderboard is
        missing); not done: the worker could not, and the caller does it itself."""
        note = self._ask(("sweep_end", end), STALL_S, stall=True)
        self.ended = True
        self._release()
        if note is None:
            log.warning("the MLflow worker did not end the sweep's parent run: ending it here")
            return False, None
        if note[0] == "failed":
            log.warning("the MLflow worker could not end the sweep's parent run (%s): ending it here", note[1])
            return False, None
        return True, note[1]

    # -- internals ---------------------------------------------------------------------------------------------
    @property
    def _flush_s(self) -> float:
        return float(getattr(self.request.tracking, "flush_timeout_s", 60.0))

    def _unavailable(self, why: str, what: str = "this job's results") -> TrackingUnavailable:
        request = self.request
        where = request.tags.get("output_dir", "the job's folder")
        return TrackingUnavailable(
            f"the MLflow store at {request.tracking.uri} did not take {what} ({why}); the results are in {where} "
            f"and the journal: run the same command again once the store answers, and it publishes them (metrics "
            f"and traces) into MLflow run {self.run_id}")

    def _bounded(self, work: Callable[[], object], what: str, *, quiet: bool = False) -> None:
        """``work`` (MLflow calls from this process, the worker gone) for at most ``tracking.flush_timeout_s``: a
        store that does not answer in that time, or cannot be reached, is ``TrackingUnavailable``; ``quiet``: any
        failure is only logged (an error is reported already)."""
        failure: list[BaseException] = []

        def run() -> None:
            try:
                work()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                failure.append(exc)

        thread = threading.Thread(target=run, name="cupid-mlflow-end", daemon=True)
        thread.start()
        thread.join(self._flush_s)
        problem = failure[0] if failure else None
        if thread.is_alive():
            problem = self._unavailable(f"no answer within {self._flush_s:g} s while trying to {what} here")
        elif problem is not None and store_unreachable(problem):
            problem = self._unavailable(f"{type(problem).__name__}: {first_line(problem)}")
        if problem is not None and not quiet:
            raise problem
        if problem is not None:
            log.debug("could not %s: %s", what, problem)

    def _here(self, totals: dict[str, float]) -> LiveRun | SimpleNamespace:
        """The run, reattached in this process after the worker failed: no progress thread, no traces."""
        from cupid_exp.tracking.mlflow import RunTracker

        request = self.request
        if self.reused:  # a run that finished earlier is never written to
            return SimpleNamespace(finish=lambda final: None, end=lambda *args: None)
        tracker = RunTracker(request.tracking, request.secrets)
        tracker.run_id = self.run_id
        return LiveRun(tracker, Claim(request.run_key), replace(request.units, done=[]), meter=SnapshotMeter(totals),
                       every_s=request.tracking.progress_every_s, traces=None, attempt=self.attempt)

    def _ask(self, message: tuple, timeout: float, *, stall: bool = False) -> tuple | None:
        """Send ``message`` to a healthy worker and wait for its 'finished' (``_wait``); None without one."""
        if not self._healthy():
            return None
        self.pipes.inbox.put(message)
        return self._wait("finished", timeout, stall=stall)

    def _wait(self, wanted: str, timeout: float, *, stall: bool = False) -> tuple | None:
        """The worker's next ``wanted`` note (or 'failed'); None if it died, or gave no sign of progress for
        ``timeout`` seconds (``stall``: since the last message it handled; else since the wait began)."""
        from multiprocessing.connection import wait

        began = moved = time.monotonic()
        seen = self.pipes.handled.value
        while True:
            ready = wait([self.pipes.notes, self.process.sentinel], 0.25)
            if self.pipes.notes in ready:
                try:
                    note = self.pipes.notes.recv()
                except (EOFError, OSError):  # it exited
                    note = None
                if note is not None:
                    if note[0] in (wanted, "failed"):
                        return note
                    self._note(note)
                    continue
            if ready:  # it exited without the note
                self.process.join(1.0)
                self._give_up(self._gone())
                return None
            now = time.monotonic()
            if self.pipes.handled.value != seen:
                seen, moved = self.pipes.handled.value, now
            if now - (moved if stall else began) >= timeout:
                self.stopped = True  # (the caller says what it means)
                return None

    def _note(self, note: tuple) -> None:
        if note[0] == "traces_stopped":
            log.warning("MLflow tracing stopped for this job: %s", note[1])
        elif note[0] == "opened":
            self.run_id, self.attempt, self.notice, self.reused = note[1:]
        elif note[0] == "failed":
            self._give_up(note[1])

    def _gone(self) -> str:
        code = self.process.exitcode
        return f"the MLflow worker exited (code {code})" if code is not None else "the MLflow worker did not answer"

    def _healthy(self) -> bool:
        """Read the worker's notes and check it is alive (two cheap system calls)."""
        with contextlib.suppress(EOFError, OSError):
            while not self.stopped and self.pipes.notes.poll():
                self._note(self.pipes.notes.recv())
        if not self.stopped and self.process.exitcode is not None:
            self._give_up(self._gone())
        return not self.stopped

    def _give_up(self, why: str) -> None:
        if not self.stopped:
            self.stopped = True
            log.warning("the MLflow worker stopped (%s): this job finishes its run itself, without further traces",
                        why)

    def _park(self) -> None:
        """The run has ended and the worker waits for this process's next job (``start``)."""
        global _IDLE, _QUIT_AT_EXIT
        self._quiet()
        self.stopped = True
        if self.claim is not None:
            self.claim.release()
        _IDLE = self
        if not _QUIT_AT_EXIT:  # registered after multiprocessing's own exit hook, so it runs first
            atexit.register(quit_idle)
            _QUIT_AT_EXIT = True

    def _quit(self) -> None:
        """Tell a parked worker to exit, and wait for it (briefly)."""
        with contextlib.suppress(OSError, ValueError):  # its queue may be closed already
            self.pipes.inbox.put(("quit",))
        self.claim = None
        self._release()

    def _release(self) -> None:
        self._quiet()
        self.stopped = True
        if self.claim is not None:
            self.claim.release()
        self.process.join(2.0)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join(5.0)
        self.pipes.inbox.cancel_join_thread()  # what the worker did not read is lost: never hang the exit on it
        self.pipes.inbox.close()
        self.pipes.notes.close()


_IDLE: RunWorker | None = None  #: the worker a finished job of a sweep left for the next one
_QUIT_AT_EXIT = False


def start(keep: bool = False) -> RunWorker | None:
    """A run worker (the one the previous job left, if it is still alive), or None (with a warning) when none
    can be started. ``keep``: when its run has finished, leave it for this process's next job."""
    idle = take_idle(keep)
    if idle is not None:
        return idle
    try:
        return RunWorker(keep)
    except (OSError, RuntimeError) as exc:  # no process, pipe or start method: the job keeps its run itself
        log.warning("the MLflow run is kept in the job's process: no worker (%s: %s)", type(exc).__name__, exc)
        return None


def take_idle(keep: bool = False) -> RunWorker | None:
    """The worker this process's last job left, if it is alive (for the next job, or the sweep's end); ready for
    a new job's state (``keep``, as ``start``)."""
    global _IDLE
    idle, _IDLE = _IDLE, None
    if idle is None:
        return None
    if idle.process.exitcode is not None:  # it died while it waited
        idle._release()
        return None
    idle._begin(keep)
    return idle


def quit_idle() -> None:
    """Stop the worker a sweep's last job left (at exit; a worker whose process died exits by itself)."""
    global _IDLE
    idle, _IDLE = _IDLE, None
    if idle is not None:
        idle._quit()
