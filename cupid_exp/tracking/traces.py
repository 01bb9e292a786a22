"""One MLflow trace per unit of work: a root span for the instance (scores as feedback) or the synthesised persona
(``TraceRoot``), a span per model call.

The spans are built after the instance finishes, from the calls ``ask`` logged for it
(``cupid_exp.llm.calls``), with the times the calls really had; nothing touches MLflow while a
call is in flight. MLflow's synchronous export writes span by span as they end, one store transaction
each (~55 ms of CPU per instance on SQLite: the worker fell a second behind a 30-instance job, and
~50 s behind 756 instances); we switch on its async export queue and batch span processor instead
(in a thread) and, for a SQLite store, a single export worker (several would only queue on the
database lock). Those are defaults: ``MLFLOW_*`` variables set by the user win. To a SQL store the
finished traces of each batch are then written in one transaction (``trace_batches``: ~13 ms of CPU
per trace instead of ~31, one commit per batch instead of two per trace). When the model phase ends,
every span has ended: the final export starts then (``executed``) and the run's end waits for it
(``close``), so MLflow's idle wait for its queue (up to a second) passes while the job summarises. All
this normally runs in the worker process that keeps the job's run (``cupid_exp.tracking.run_worker``).

Why explicit spans rather than ``mlflow.litellm.autolog``: autolog makes one trace per call (not
per instance), knows neither the step nor re-asks, and would put litellm's logging callbacks, which
the client unhooks for speed, back on every call.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from cupid_exp.llm.calls import CallLog, CallRecord
from cupid_exp.results import InstanceResult, long_texts, previewed
from cupid_exp.secrets import scrub_obj

log = logging.getLogger(__name__)

# Batches of up to 256 spans, at least every 0.1 s: few store writes, little left to export when the model phase
# ends (the plots are drawn in the same process then), and little lost if the process is SIGKILLed.
_EXPORT_DEFAULTS = {"MLFLOW_ENABLE_ASYNC_TRACE_LOGGING": "true", "MLFLOW_USE_BATCH_SPAN_PROCESSOR": "true",
                    "MLFLOW_ASYNC_TRACE_LOGGING_MAX_SPAN_BATCH_SIZE": "256",
                    "MLFLOW_ASYNC_TRACE_LOGGING_MAX_INTERVAL_MILLIS": "100"}


def setup(uri: str) -> Any:
    """A fresh trace exporter for this job, pointed at ``uri``, with the export defaults above (the previous
    job of a sweep run in this process shut its own down: ``TraceWriter.executed``), writing in batches
    to a SQL store (``trace_batches``; returned, None where MLflow's exporter stays)."""
    import mlflow

    from cupid_exp.reporting.runs import env_uri_kept
    from cupid_exp.tracking import trace_batches

    for key, value in _EXPORT_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if uri.startswith("sqlite:"):
        os.environ.setdefault("MLFLOW_ASYNC_TRACE_LOGGING_MAX_WORKERS", "1")
    with env_uri_kept():
        mlflow.set_tracking_uri(uri)
    mlflow.tracing.reset()
    return trace_batches.install()


@dataclass
class TraceRoot:
    """A unit's root span as plain data (``Result.trace_root``), for a kind of work whose unit is not an evaluated
    instance: a synthesised persona's inputs (its template), outputs and failed steps."""

    name: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    attributes: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    errors: list[tuple[str, str, str]] = field(default_factory=list)  #: (kind, message, step)


def trace_input(unit: Any, result: Any) -> Any:
    """What a unit's trace shows of the unit itself, sent with its result to where the run is kept: an evaluated
    instance's request and context factor (its history stays behind); another unit's trace is its result's own
    (``TraceRoot``)."""
    if not isinstance(result, InstanceResult):
        return None
    from types import SimpleNamespace

    return SimpleNamespace(current_request=unit.current_request, current_context_factor=unit.current_context_factor)


def _chat_reply(call: CallRecord) -> dict[str, Any]:
    """The reply in OpenAI's response shape, so MLflow's trace view shows the exchange as a chat."""
    return {"choices": [{"index": 0, "finish_reason": call.finish_reason,
                         "message": {"role": "assistant", "content": call.reply}}],
            "usage": {"prompt_tokens": call.prompt_tokens, "completion_tokens": call.completion_tokens,
                      "total_tokens": call.prompt_tokens + call.completion_tokens}}


class TraceWriter:
    """A job's tracer where the run is kept (the run worker, or the job's process as a fallback): builds each finished
    instance's trace in the job's experiment, linked to the job's run, MLflow's threads exporting. Every text in it
    is scrubbed of the job's secrets (a provider's auth error may quote the key it rejected)."""

    def __init__(self, experiment_id: str, run_id: str, tags: Mapping[str, str], judges: Mapping[str, str],
                 secrets: list[str] | None = None):
        self.experiment_id, self.run_id = experiment_id, run_id
        self.secrets = list(secrets or [])
        self.tags = dict(tags)  #: on every trace (model, setting, task, ...)
        self.judges = dict(judges)  #: part -> the evaluator model whose labels the scores come from
        self.error: str | None = None  #: why tracing stopped, once it has
        self._final: threading.Event | None = None  # the last export, once the model phase is over

    def write(self, instance: Any, result: InstanceResult, calls: CallLog) -> None:
        """Never raises: a trace that cannot be built is logged once and tracing stops for the job."""
        self._guarded(lambda: self._write(instance, result, calls))

    def _guarded(self, write: Callable[[], None]) -> None:
        if self.error is not None:
            return
        try:
            write()
        except Exception as exc:  # noqa: BLE001  # tracing must never stop the job
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("MLflow tracing stopped for this job: %s", self.error)

    def _write(self, instance: Any, result: Any, calls: CallLog) -> None:
        """The unit's root span (an instance's, or another unit's as it described itself: ``TraceRoot``), a span per
        call, then the root's end."""
        if isinstance(result, InstanceResult):
            root = self._instance_root(instance, result, {}, calls.started_ns)
            ended = self._call_spans(root, calls, *_outputs(result).values())
            self._end_instance(root, result, ended)
            return
        spec = result.trace_root()
        root = self._root(spec.name, spec.inputs, spec.attributes, {**spec.tags, "cupid.key": spec.name},
                          calls.started_ns)
        ended = self._call_spans(root, calls)
        for kind, message, step in spec.errors:
            self._fail(root, kind, message, step)
        root.end(outputs=self._clean(spec.outputs), end_time_ns=ended)

    def _call_spans(self, root: Any, calls: CallLog, *outputs: object) -> int:
        """A span per call, in the order they started, each long text of the replies and ``outputs`` previewed;
        returns when the unit ended (its last call's end)."""
        quoted = long_texts(*(c.reply for c in calls.calls), *outputs)
        for call in sorted(calls.calls, key=lambda c: c.started_ns):
            self._call_span(root, call, quoted)
        return max([c.ended_ns for c in calls.calls] + [calls.started_ns + 1])

    def _root(self, name: str, inputs: dict[str, Any], attributes: dict[str, Any], tags: dict[str, str],
              started_ns: int | None) -> Any:
        """A unit's root span, with the job's tags and its run."""
        import mlflow
        from mlflow.entities import SpanType

        return mlflow.start_span_no_context(
            name, span_type=SpanType.CHAIN, experiment_id=self.experiment_id, start_time_ns=started_ns,
            inputs=self._clean(inputs), attributes=attributes, tags={**self.tags, **tags},
            metadata={"mlflow.sourceRun": self.run_id})

    def _instance_root(self, instance: Any, result: InstanceResult, marks: dict[str, str],
                       started_ns: int | None = None) -> Any:
        """An instance's root span; ``marks`` go into its attributes and tags."""
        return self._root(
            result.key, {"current_request": instance.current_request,  # first: the Traces page previews it
                         "context_factor": instance.current_context_factor, "key": result.key,
                         "instance_type": result.instance_type},
            {"cupid.persona_id": result.persona_id, "cupid.instance_type": result.instance_type, **marks},
            {"cupid.key": result.key, "cupid.instance_type": result.instance_type, **marks}, started_ns)

    def _end_instance(self, root: Any, result: InstanceResult, ended_ns: int | None = None) -> None:
        """Its scores as assessments, its errors as events, then its outputs."""
        self._assess(root.trace_id, result)
        for error in result.errors:
            self._fail(root, error.kind, error.message, error.step)
        root.end(outputs=self._clean(previewed(_outputs(result))), end_time_ns=ended_ns)

    def _fail(self, span: Any, kind: str, message: str, step: str) -> None:
        """The span's status ERROR, and the error as its event."""
        from mlflow.entities import SpanEvent

        span.set_status("ERROR")
        span.add_event(SpanEvent("exception", attributes={
            "exception.type": kind, "exception.message": self._clean(message)[:2000], "cupid.step": step}))

    def write_record(self, instance: Any, record: Mapping[str, Any], parts: tuple[str, ...]) -> None:
        """An instance's trace rebuilt from its journal record, for an earlier attempt's instance whose trace never
        reached the store: the scores, errors and assessments as a live trace has them, and one span per step with
        its replies and usage; not the messages sent, nor when the calls were made (the record keeps neither).
        Never raises, as ``write``."""
        self._guarded(lambda: self._write_record(instance, InstanceResult.from_record(record, parts)))

    def _write_record(self, instance: Any, result: InstanceResult) -> None:
        import mlflow
        from mlflow.entities import SpanType

        root = self._instance_root(instance, result, {"cupid.rebuilt": "from the journal"})
        for step in dict.fromkeys([*result.usage, *result.raw]):
            usage = result.usage.get(step, {})
            span = mlflow.start_span_no_context(
                step, span_type=SpanType.CHAT_MODEL, parent_span=root,
                attributes={"cupid.step": step, **{f"cupid.{k}": v for k, v in usage.items()}})
            span.end(outputs=self._clean({"replies": result.raw.get(step, [])}))
        self._end_instance(root, result)

    def executed(self) -> None:
        """No more traces (the last instance's spans have ended): start the final export now, in a thread, which
        also stops the export threads (MLflow would otherwise drain them again at exit: a second wait of about a
        second); ``close`` waits for it."""
        import mlflow

        if self._final is not None:
            return
        self._final = done = threading.Event()

        def work() -> None:
            try:
                mlflow.flush_trace_async_logging(terminate=True)
            finally:
                done.set()

        threading.Thread(target=work, name="cupid-trace-flush", daemon=True).start()

    def close(self, timeout: float | None = None) -> bool:
        """Wait for the final export (``timeout`` None: until it ends); whether every trace got into the store."""
        self.executed()
        done = self._final.wait(timeout)
        if not done:
            log.warning("MLflow trace export gave up after %.0f s; traces of this attempt may be missing", timeout)
        return done

    def _clean(self, value: Any) -> Any:
        return scrub_obj(value, self.secrets)

    def _call_span(self, root: Any, call: CallRecord, quoted: tuple[str, ...]) -> None:
        """A call's span; each of the unit's long replies (``quoted``) as its preview, in the reply and in any prompt
        quoting it (a judge's, a re-ask's): whole only in the journal."""
        import mlflow
        from mlflow.entities import SpanType

        name = call.step if call.attempt == 0 else f"{call.step} (attempt {call.attempt + 1})"
        attributes = {
            "cupid.step": call.step, "cupid.attempt": call.attempt, "cupid.model": call.model,
            "cupid.cache_hit": call.cached, "cupid.retries": call.retries,
            "cupid.cost_usd": None if call.cost_usd is None else round(call.cost_usd, 10),  # no float noise
            "cupid.latency_s": round((call.ended_ns - call.started_ns) / 1e9, 4),
            "cupid.finish_reason": call.finish_reason,
            "mlflow.llm.model": call.litellm_model, "mlflow.message.format": "openai",
            "mlflow.llm.cost": {"total_cost": 0.0 if call.cached else (call.cost_usd or 0.0)},
        }
        if call.reply is not None:
            attributes["mlflow.chat.tokenUsage"] = {
                "input_tokens": call.prompt_tokens, "output_tokens": call.completion_tokens,
                "total_tokens": call.prompt_tokens + call.completion_tokens}
        span = mlflow.start_span_no_context(name, span_type=SpanType.CHAT_MODEL, parent_span=root,
                                            inputs=self._clean(previewed({"messages": call.messages}, quoted)),
                                            attributes=attributes,
                                            start_time_ns=call.started_ns)
        if call.rejected is not None:
            self._fail(span, call.rejected.kind, call.rejected.message, call.step)
        reply = self._clean(previewed(_chat_reply(call), quoted)) if call.reply is not None else None
        span.end(outputs=reply, end_time_ns=call.ended_ns)

    def _assess(self, trace_id: str, result: InstanceResult) -> None:
        """Scores and truths ride with the trace (added while it is still in memory: no extra store call)."""
        from mlflow.entities import AssessmentError, AssessmentSource, Expectation, Feedback
        from mlflow.tracing.trace_manager import InMemoryTraceManager

        meta = {"mlflow.assessment.sourceRunId": self.run_id}
        items: list[Any] = [Expectation(name="expected_preference", value=self._clean(result.truth.gt_preference),
                                        source=AssessmentSource(source_type="HUMAN", source_id="dataset"))]
        failure = next(iter(result.errors), None)
        error = (AssessmentError(error_code=failure.kind, error_message=self._clean(failure.message)) if failure
                 else None)
        scores: list[tuple[str, str, Any]] = []
        if result.inference is not None:
            scores += [("inference", n, getattr(result.inference, n)) for n in ("precision", "recall", "f1")]
        if result.generation is not None:
            scores.append(("generation", "judge_score", result.generation.judge_score))
        for part, name, value in scores:
            source = AssessmentSource(source_type="LLM_JUDGE", source_id=self.judges.get(part, "evaluator"))
            items.append(Feedback(name=name, value=value, source=source, metadata=meta) if value is not None
                         else Feedback(name=name, error=error or AssessmentError(error_code="not_scored"),
                                       source=source, metadata=meta))
        with InMemoryTraceManager.get_instance().get_trace(trace_id) as trace:
            if trace is not None:
                trace.info.assessments.extend(items)


def _outputs(result: InstanceResult) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if result.inference is not None:
        out.update(inferred_preference=result.inference.inferred_preference,
                   inferred_checklist=result.inference.inferred_checklist, precision=result.inference.precision,
                   recall=result.inference.recall, f1=result.inference.f1)
    if result.generation is not None:
        out.update(response=result.generation.response, judge_score=result.generation.judge_score)
    if result.errors:
        out["errors"] = [e.to_record() for e in result.errors]
    return out
