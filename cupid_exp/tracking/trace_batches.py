"""Finished traces written to a SQL tracking store a batch at a time: one transaction, one commit per batch.

Why: MLflow's exporter writes a trace in two transactions: its spans first (which creates the trace's row),
then its info (``start_trace``), which finds that row already there and takes MLflow's conflict path (a
rollback, then one merge per tag, metadata item and assessment): ~31 ms of CPU per trace on SQLite here. Each
commit also waits for the disk (a SQLite commit is ~4 fdatasyncs, ~20 ms here). One export thread then wrote
fewer traces per second than a job at concurrency 64 finishes instances, and the job waited for the backlog
at its end (~15 s at 756 instances, 2026-11-25).

Here the exporter's ``export`` (which MLflow's batch span processor calls with the spans that ended, every
0.1 s) takes each finished trace whole from MLflow's trace manager and queues the batch on MLflow's own async
export queue. There it is written the way MLflow writes a trace whose info comes first: ``start_trace`` for
each (a plain insert), then all their spans in one ``log_spans`` call, inside one transaction on one
connection: ~13 ms of CPU per trace and one commit per batch. The rows are those of MLflow's own calls. A
batch that fails as a whole is rolled back and written again trace by trace, by the same calls, each in its
own transaction; what still fails is MLflow's to report (its queue logs it), as with its own exporter.

Only where the store is MLflow's SQL store in this process; a tracking server keeps MLflow's exporter. This
reaches into MLflow (its exporter, trace manager and session maker); ``install`` says whether it could.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

log = logging.getLogger(__name__)

_WRAPPED = "_cupid_batch_sessions"  #: the store's attribute that marks its session maker as ours


class BatchTraceExport:
    """The export side of one tracer: what the batch span processor hands over, queued and written in batches."""

    def __init__(self, exporter: Any, store: Any):
        from mlflow.tracing.trace_manager import InMemoryTraceManager

        self.exporter, self.store = exporter, store
        self.manager = InMemoryTraceManager.get_instance()
        self.batches = 0  #: batches written in one transaction
        self.fallbacks = 0  #: batches written again trace by trace
        self._joined = _joinable_sessions(store)

    def export(self, spans: Sequence[Any]) -> None:
        """Called by the span processor's thread with the spans that ended. A trace is taken when its root
        ends: the TraceWriter ends every call's span before the root, so the trace is complete then."""
        from mlflow.tracing.export.async_export_queue import Task
        from mlflow.tracing.utils import add_size_stats_to_trace_metadata

        traces = []
        for span in spans:
            if span.parent is None and (finished := self.manager.pop_trace(span.context.trace_id)) is not None:
                add_size_stats_to_trace_metadata(finished.trace)  # once: it counts the metadata it finds
                traces.append(finished.trace)
        if traces:
            self.exporter._async_queue.put(Task(handler=self.write, args=(traces,),
                                                error_msg="Failed to log traces to the tracking store."))

    def write(self, traces: list[Any]) -> None:
        """On MLflow's export thread: the batch in one transaction, else trace by trace."""
        try:
            self._in_one_transaction(traces)
            self.batches += 1
        except Exception as exc:  # noqa: BLE001 - rolled back: every trace is written again below
            log.debug("a batch of %d traces was rolled back (%s: %s); writing them one by one", len(traces),
                      type(exc).__name__, exc)
            self.fallbacks += 1
            for trace in traces:
                self._write_all([trace])

    def _in_one_transaction(self, traces: list[Any]) -> None:
        from sqlalchemy.orm import sessionmaker

        with self.store.engine.connect() as connection:
            transaction = connection.begin()
            # every session MLflow opens on this thread joins the transaction; their commits are not the commit
            with self._joined(sessionmaker(bind=connection, join_transaction_mode="rollback_only")):
                self._write_all(traces)
            if not transaction.is_active:  # a call rolled it back (MLflow's conflict path): nothing was kept
                raise RuntimeError("the batch's transaction was rolled back by a call inside it")
            transaction.commit()

    def _write_all(self, traces: list[Any]) -> None:
        client = self.exporter._client
        spans: dict[str, list[Any]] = defaultdict(list)
        for trace in traces:
            client.start_trace(trace.info)
            spans[trace.info.experiment_id].extend(trace.data.spans)
        for experiment_id, experiment_spans in spans.items():
            client.log_spans(experiment_id, experiment_spans)


def _joinable_sessions(store: Any) -> Any:
    """Make ``store`` open its sessions on a given connection while a thread asks for it (``joined(maker)``),
    and as before on every other thread; while joined, the thread reads each experiment once (``start_trace``
    reads its trace's experiment for every trace: a tenth of the export's CPU). Wraps the store's session maker
    and ``get_experiment`` once (a sweep's jobs share the store)."""
    joined = getattr(store, _WRAPPED, None)
    if joined is not None:
        return joined
    from mlflow.store.db.db_types import SQLITE
    from mlflow.store.db.utils import _get_managed_session_maker

    original = store.ManagedSessionMaker
    local = threading.local()

    def managed_session(read_only: bool = True) -> Any:
        return (getattr(local, "maker", None) or original)(read_only=read_only)

    read_experiment = store.get_experiment

    def get_experiment(experiment_id: str) -> Any:
        # ``start_trace`` reads its trace's experiment, every trace: a batch's traces share one (or a few)
        return (getattr(local, "read", None) or read_experiment)(experiment_id)

    @contextmanager
    def joined(session_maker: Any) -> Iterator[None]:
        managed = _get_managed_session_maker(session_maker, store.db_type)
        with managed():  # MLflow's settings of each session (SQLite's PRAGMAs) hold for the connection: set once
            pass
        # the batch's own sessions (one a trace and several a batch, three PRAGMA statements each on SQLite) share
        # that connection: opened by MLflow's maker as for any other database, without them
        local.maker = _get_managed_session_maker(session_maker, "joined") if store.db_type == SQLITE else managed
        local.read = functools.cache(read_experiment)
        try:
            yield
        finally:
            local.maker = local.read = None

    store.ManagedSessionMaker = managed_session
    store.get_experiment = get_experiment
    setattr(store, _WRAPPED, joined)
    return joined


def install() -> BatchTraceExport | None:
    """Batch this process's trace export (call after ``traces.setup``); None where MLflow's exporter stays: the
    store is not MLflow's SQL store, the export is not asynchronous, or this MLflow is laid out otherwise."""
    try:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
        from mlflow.tracing.export.mlflow_v3 import MlflowV3SpanExporter
        from mlflow.tracing.provider import _get_trace_exporter, _get_tracer

        _get_tracer(__name__)  # the tracer provider, its processor and exporter, as the first span would make them
        exporter = _get_trace_exporter()
        if type(exporter) is not MlflowV3SpanExporter or not getattr(exporter, "_is_async_enabled", False):
            return None
        store = exporter._client.store
        if not isinstance(store, SqlAlchemyStore):
            return None
        batches = BatchTraceExport(exporter, store)
    except (ImportError, AttributeError) as exc:
        log.info("MLflow's own trace export is kept (%s: %s)", type(exc).__name__, exc)
        return None
    exporter.export = batches.export
    return batches
