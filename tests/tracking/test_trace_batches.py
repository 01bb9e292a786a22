"""Traces written to a SQL store a batch at a time (``cupid_exp.tracking.trace_batches``): the same traces as
MLflow's own exporter writes, fewer transactions, and a batch that fails written again trace by trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
from mlflow.tracking import MlflowClient

from cupid_exp.llm.calls import CallLog, CallRecord
from cupid_exp.results import HistoryView, InferenceResult, InstanceResult, Truth
from cupid_exp.tracking import trace_batches, traces

N = 40


def _instance(i: int) -> tuple[object, InstanceResult, CallLog]:
    from types import SimpleNamespace

    key = f"{100 + i}+teacher/consistent"
    start = 1_700_000_000_000_000_000 + i * 1_000_000_000
    calls = CallLog(started_ns=start, calls=[
        CallRecord(step=step, attempt=0, model="gpt4o", litellm_model="openai/gpt-4o",
                   messages=[{"role": "user", "content": f"{step} for instance {i}"}],
                   started_ns=start + n * 1000, ended_ns=start + n * 1000 + 500, reply=f"{step} reply {i}",
                   prompt_tokens=10 + n, completion_tokens=2, cost_usd=0.001, finish_reason="stop")
        for n, step in enumerate(("infer", "decompose", "match_precision", "match_recall"))])
    result = InstanceResult(
        key=key, persona_id=f"{100 + i}+teacher", instance_type="consistent",
        truth=Truth(gt_preference=f"preference {i}", gt_checklist=["a", "b"], gt_checklist_len=2,
                    context_factor="class"),
        history=HistoryView(n_context_sessions=8, relevant_positions=[1], n_prior_sessions=8, history_words=100),
        inference=InferenceResult(inferred_preference=f"inferred {i}", inferred_checklist=["a"], precision=1.0,
                                  recall=0.5, f1=2 / 3))
    return SimpleNamespace(current_request=f"request {i}", current_context_factor="class"), result, calls


def _write(uri: str, n: int, *, batched: bool, monkeypatch: pytest.MonkeyPatch, name: str = "",
           prepare: Callable[[Any], None] = lambda batches: None) -> tuple[str, Any]:
    """``n`` instances traced into a new experiment at ``uri``; the experiment id and the batch exporter
    (``prepare``d before the first trace)."""
    if not batched:
        monkeypatch.setattr(trace_batches, "install", lambda: None)
    client = MlflowClient(uri)
    experiment = client.create_experiment(name or f"traces-{batched}")
    run = client.create_run(experiment).info.run_id
    batches = traces.setup(uri)
    prepare(batches)
    tracer = traces.TraceWriter(experiment, run, {"cupid.model": "gpt4o"}, {"inference": "gpt4o"})
    for i in range(n):
        tracer.write(*_instance(i))
    assert tracer.close(60) and tracer.error is None
    return experiment, batches


def _stored(uri: str, experiment: str) -> dict[str, dict]:
    """Each stored trace by its instance key, without what differs between two writes (ids, times)."""
    out = {}
    for trace in MlflowClient(uri).search_traces(locations=[experiment], max_results=1000):
        info = trace.info
        out[info.tags["cupid.key"]] = {
            "state": info.state, "request_preview": info.request_preview, "response_preview": info.response_preview,
            "tags": {k: v for k, v in info.tags.items() if k != "mlflow.artifactLocation"},
            # the size MLflow measures of a trace varied by a few bytes between two writes of the same one (CI, under
            # load: 8928 against 8896); what we write is compared, not MLflow's measure of it
            "metadata": {k: v for k, v in info.trace_metadata.items()
                         if k not in ("mlflow.sourceRun", "mlflow.trace.sizeBytes", "mlflow.trace.sizeStats")},
            "token_usage": info.token_usage,
            "assessments": sorted((a.name, str(a.value)) for a in info.assessments),
            "spans": [(s.name, s.span_type, s.inputs, s.outputs, s.start_time_ns, s.end_time_ns,
                       {k: v for k, v in s.attributes.items()
                        if k not in ("mlflow.traceRequestId", "mlflow.experimentId")})
                      for s in trace.data.spans],
        }
    return out


def _difference(ours: dict[str, dict], theirs: dict[str, dict]) -> str:
    """The first way two stores' traces differ, in a line (a whole trace's repr hid it in CI), or ''."""
    if ours.keys() != theirs.keys():
        return (f"keys only ours: {sorted(ours.keys() - theirs.keys())}, "
                f"only theirs: {sorted(theirs.keys() - ours.keys())}")
    for key in sorted(ours):
        for field in ours[key]:
            a, b = ours[key][field], theirs[key].get(field)
            if a != b:
                if field == "spans" and len(a) == len(b):
                    at = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
                    a, b = a[at], b[at]
                    parts = [j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
                    a, b = [a[j] for j in parts], [b[j] for j in parts]
                    return f"{key} span {at} parts {parts}: ours {a!r:.600} theirs {b!r:.600}"
                return f"{key} {field}: ours {a!r:.600} theirs {b!r:.600}"
    return ""


def test_batches_store_what_mlflows_own_exporter_stores_in_fewer_transactions(tmp_path: Path, monkeypatch) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ours, batches = _write(uri, N, batched=True, monkeypatch=monkeypatch)
    assert isinstance(batches, trace_batches.BatchTraceExport)  # this MLflow is the one the module expects
    assert 1 <= batches.batches < N and batches.fallbacks == 0  # several traces per transaction
    theirs, plain = _write(uri, N, batched=False, monkeypatch=monkeypatch)
    assert plain is None
    stored = _stored(uri, ours)
    assert len(stored) == N and not (diff := _difference(stored, _stored(uri, theirs))), diff
    some = stored[f"{100 + 3}+teacher/consistent"]
    assert [s[0] for s in some["spans"]] == ["103+teacher/consistent", "infer", "decompose", "match_precision",
                                             "match_recall"]
    assert some["token_usage"]["input_tokens"] == 10 + 11 + 12 + 13


def test_a_batch_reads_its_experiment_once_not_once_per_trace(tmp_path: Path, monkeypatch) -> None:
    """MLflow's ``start_trace`` reads the trace's experiment for every trace (a tenth of the export's CPU); in a
    batch the store reads it once, and the traces are those of the test above (the same calls write them)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    reads: list[str] = []
    original = SqlAlchemyStore.get_experiment

    def counted(self: Any, experiment_id: str) -> Any:
        reads.append(experiment_id)
        return original(self, experiment_id)

    monkeypatch.setattr(SqlAlchemyStore, "get_experiment", counted)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment, batches = _write(uri, N, batched=True, monkeypatch=monkeypatch, prepare=lambda _: reads.clear())
    assert batches.fallbacks == 0 and 1 <= batches.batches < N
    assert reads and set(reads) == {experiment} and len(reads) <= batches.batches
    assert len(_stored(uri, experiment)) == N
    reads.clear()
    assert MlflowClient(uri).get_experiment(experiment).experiment_id == experiment  # outside a batch: read as ever
    assert reads == [experiment]


def test_a_batch_sets_sqlites_session_pragmas_once_not_per_session(tmp_path: Path, monkeypatch) -> None:
    """MLflow opens each session with three PRAGMA statements on SQLite, and ``start_trace`` opens one a trace,
    ``log_spans`` several a batch; a batch's sessions share one connection, where the PRAGMAs are set once."""
    from sqlalchemy import event

    statements: list[str] = []

    def count(batches: Any) -> None:
        event.listen(batches.store.engine, "before_cursor_execute",
                     lambda conn, cursor, statement, *rest: statements.append(statement))

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment, batches = _write(uri, N, batched=True, monkeypatch=monkeypatch, prepare=count)
    assert batches.fallbacks == 0 and 1 <= batches.batches < N
    pragmas = [s for s in statements if s.lstrip().upper().startswith("PRAGMA")]
    assert "PRAGMA foreign_keys = ON;" in pragmas  # the batch still sets them (and what counted them saw the writes)
    assert len(pragmas) <= 3 * batches.batches, len(pragmas)  # 3 per session before: 126 for 40 traces in one batch
    assert len(_stored(uri, experiment)) == N


def test_a_batch_that_fails_is_rolled_back_and_written_trace_by_trace(tmp_path: Path, monkeypatch) -> None:
    """The first batch's spans are refused: its transaction is rolled back (its traces' rows with it, or writing
    them again would take MLflow's conflict path and add their assessments twice), then each trace is written
    alone. The store holds what MLflow's own exporter writes."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def refuse_once(batches: Any) -> None:
        client = batches.exporter._client
        log_spans, refused = client.log_spans, []

        def failing(*args: Any, **kwargs: Any) -> Any:
            if not refused:
                refused.append(True)
                raise RuntimeError("the store refused a batch")
            return log_spans(*args, **kwargs)

        monkeypatch.setattr(client, "log_spans", failing)

    experiment, batches = _write(uri, 5, batched=True, monkeypatch=monkeypatch, prepare=refuse_once)
    assert batches.fallbacks == 1
    plain, _ = _write(uri, 5, batched=False, monkeypatch=monkeypatch)
    stored = _stored(uri, experiment)
    assert len(stored) == 5 and not (diff := _difference(stored, _stored(uri, plain))), diff


def test_a_store_that_is_not_sql_keeps_mlflows_exporter(tmp_path: Path, monkeypatch) -> None:
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(uri)
    client.create_experiment("file")
    assert traces.setup(uri) is None
