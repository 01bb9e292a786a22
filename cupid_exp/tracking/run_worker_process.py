"""The run worker's own process: it keeps the job's MLflow run, and exports and exits when its job dies."""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import queue
from typing import TYPE_CHECKING, Any

from cupid_exp.durability.attempts import Claim
from cupid_exp.durability.signals import ignore_stops
from cupid_exp.errors import first_line
from cupid_exp.tracking import store_errors
from cupid_exp.tracking.live import LiveRun, RunRequest, open_run
from cupid_exp.tracking.mlflow import ensure_parent

if TYPE_CHECKING:
    import ctypes
    from multiprocessing.connection import Connection
    from multiprocessing.queues import Queue

ORPHAN_FLUSH_S = 5.0  #: a worker whose job process died exports what it built for at most this long (then exits)


class SnapshotMeter:
    """The job's usage totals as its process last sent them (what ``LiveRun`` reads for progress points)."""

    def __init__(self, latest: dict[str, float] | None = None):
        self.latest = dict(latest or {})

    def totals(self) -> dict[str, float]:
        return dict(self.latest)


def serve(inbox: Queue[tuple[Any, ...]], outbox: Connection, progress: ctypes.c_longlong) -> None:
    """The worker: open the run, hear of instances, finish or end it, say so, exit (or await a sweep's next)."""
    ignore_stops()  # Ctrl-C and a launcher's SIGTERM reach the whole process group: the job decides, and tells us
    from cupid_exp.tracking import traces

    logging.getLogger(traces.__name__).addHandler(logging.NullHandler())  # the job reports failures, once
    # warnings to stderr as Python's last resort would print them, but a failing store's notes kept off it (this
    # process has no log file; the job reports the store's failure in its one line)
    console = logging.StreamHandler()
    console.setLevel(logging.WARNING)
    logging.getLogger().addHandler(console)
    store_errors.install()
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401  # now, while the job is still starting
    import mlflow.tracing.export.mlflow_v3  # noqa: F401
    import mlflow.tracing.provider  # noqa: F401

    # The queue's writing end came along with it: closed here, so that a job killed half-way through sending a
    # message leaves this end an EOF, not a read that waits for the rest forever (an orphan worker).
    inbox._writer.close()
    parent = multiprocessing.parent_process()
    meter = SnapshotMeter()
    live: LiveRun | None = None
    reported = False

    def say(note: tuple[Any, ...]) -> None:
        """A note to the job; a job that died meanwhile (kill -9) leaves this worker an orphan, not a traceback."""
        try:
            outbox.send(note)
        except OSError:  # BrokenPipeError: nobody reads
            _export_and_exit(live)

    while True:
        try:
            message = inbox.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                _export_and_exit(live)
            continue
        except (EOFError, OSError):  # the job died (mid-message, or with its end closed)
            _export_and_exit(live)
        kind = message[0]
        if kind in ("totals", "instance", "executed", "finish"):  # the job's usage totals come second (the next
            meter.latest = message[1]  # progress point shows them)
        try:
            if kind == "open":
                request: RunRequest = message[1]
                live = open_run(request, Claim(request.run_key), meter)  # the job holds the claim's lock
                say(("opened", live.run_id, live.attempt, live.notice, getattr(live, "reused", False)))
            elif kind == "instance" and live is not None:
                # what the end will need (the table, the plots: ~1 s of CPU), imported with the first instance, once
                # the job calls models, not while its processes import theirs (later instances: a lookup)
                import cupid_exp.reporting.plots  # noqa: F401
                shown, result, calls = pickle.loads(message[2])
                live.instance_finished(shown, result, result.to_record(), calls)
                error = getattr(live.traces, "error", None)
                if error and not reported:
                    reported = True
                    say(("traces_stopped", error))
            elif kind == "executed" and live is not None:
                live.executed()
                live.draw_plots()  # while the job computes its numbers (files only: logged at the finish)
            elif kind == "finish" and live is not None:
                live.finish(message[2])
                say(("finished",))
                if not message[3]:
                    os._exit(0)  # all is in the store: skip the interpreter's teardown (and MLflow's exit-time drain)
                live, meter, reported = None, SnapshotMeter(), False  # the sweep's next job may take this worker
            elif kind == "sweep":  # the sweep's parent run, before its first job's run
                ensure_parent(message[1], message[2], message[3])
            elif kind == "sweep_end":
                from cupid_exp.tracking.sweep import finish_sweep

                say(("finished", finish_sweep(message[1])))
                os._exit(0)
            elif kind == "quit":
                os._exit(0)
            elif kind == "end":
                if live is not None:
                    meter.latest = message[3]
                    live.end(message[1], message[2], message[4])
                say(("finished",))
                os._exit(0)
        except Exception as exc:  # noqa: BLE001  # the job hears why (and whether the store is to blame)
            first = first_line(exc, 300)
            say(("failed", f"{type(exc).__name__}: {first}", store_errors.store_unreachable(exc)))
            _export_and_exit(live, 1)
        progress.value += 1


def _export_and_exit(live: LiveRun | None, code: int = 0) -> None:
    """Export what was built (bounded) and exit: the job died (the run stays RUNNING), or this worker failed (1)."""
    if live is not None and live.traces is not None:
        live.traces.close(ORPHAN_FLUSH_S)
    os._exit(code)
