"""The job's MLflow run while the job works: progress points (stepped by units done, so a resume's curves continue), a
trace per instance, and ``end``, the one way it ends. A thread logs; the event loop never waits on MLflow."""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from cupid_exp.config import DataConfig, TrackingConfig
from cupid_exp.data.loading import LoadedData
from cupid_exp.durability.attempts import Claim
from cupid_exp.durability.signals import Terminated
from cupid_exp.llm.calls import CallLog
from cupid_exp.llm.pools import pool_metrics
from cupid_exp.progress import Totals, read_totals
from cupid_exp.results import InstanceResult
from cupid_exp.scoring.statistics import TASK_METRICS, point_value, task_frame
from cupid_exp.tracking import reopen
from cupid_exp.tracking.mlflow import RunTracker, SweepParent, parent_of, records_table, scored_name, subset_of
from cupid_exp.tracking.store_errors import STORE_NOTE

if TYPE_CHECKING:
    from mlflow.entities import Dataset

    from cupid_exp.tracking.reopen import FinishedEarlier
    from cupid_exp.tracking.traces import TraceWriter

log = logging.getLogger(__name__)

PERCENT_STEP = 0.05  #: a point whenever this share of the instances is newly done
MIN_GAP_S = 1.0  #: never two points closer than this
INTERRUPTED_FLUSH_S = 10.0  #: how long an interrupted job waits for its traces


def running_scores(records: Sequence[Mapping[str, Any]], parts: Sequence[str], policy: str) -> dict[str, float]:
    """Macro P/R/F1 and judge score so far, as the final numbers are computed (failure policy included)."""
    out: dict[str, float] = {}
    for part in parts:
        frame = task_frame(records, part, policy)
        for metric in TASK_METRICS[part]:
            value = point_value(frame, metric)
            if value == value:
                out[f"progress/{part}/{metric}"] = value
    return out


@dataclass
class Units:
    """The job's units, as its run counts them."""

    total: int
    parts: tuple[str, ...]
    policy: str
    done: list[dict[str, Any]]  #: the journal's finished records
    earlier: dict[str, float]  #: the earlier attempts' usage
    noun: str = "instances"  #: what they are called in metric names and notes (``progress/<noun>_done``)


@dataclass
class Opened:
    """What opening the run found (``open_run``)."""

    name: str = ""  #: the run's name as opened: its results go after it when it ends (``finish``)
    carried: dict[str, float] | None = None  #: earlier attempts' usage from the run itself (``reopen``)
    resumed: bool = False  #: the run is an earlier attempt's, reopened: it may hold a unit's earlier trace
    seconds_before: float = 0.0  #: the earlier attempts' ``progress/seconds``: a resumed curve goes on from there


@dataclass
class Ticks:
    """The progress thread and its points."""

    every_s: float
    signalled: int  #: units done when the thread was last woken
    wake: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    logged: tuple[object, ...] | None = None  #: (units done, calls, batch counts) at the last point
    started: float = field(default_factory=time.perf_counter)
    failing: bool = False  #: a failed point was reported: the next ones are not, until one gets through


class LiveRun:
    """Observer of a job's instances (``execute``) and owner of its run's end (``ends_on_error``)."""

    def __init__(self, tracker: RunTracker, claim: Claim, units: Units, *, meter: Totals, every_s: float,
                 traces: TraceWriter | None, attempt: str, plots: "PlotRequest | None" = None):
        self.tracker, self.claim, self.traces, self.attempt, self.units = tracker, claim, traces, attempt, units
        self.plots, self.drawn = plots, None  # drawn: the plot files, once ``draw_plots`` made them
        self.meter, self.opened = meter, Opened()
        self._records: list[Mapping[str, Any]] = list(units.done)
        self._lock = threading.Lock()
        self.ticks = Ticks(every_s, len(self._records))
        self.notice: str | None = None  #: what opening the run found, for the job to say (``reopen``)
        self.backfill: RunRequest | None = None  #: whose journalled instances' traces to rebuild (``executed``)
        self.rebuilt = 0  #: traces rebuilt from the journal

    @property
    def wants_calls(self) -> bool:
        return self.traces is not None

    @property
    def run_id(self) -> str:
        return self.tracker.run_id

    def wait_opened(self) -> None:
        """Opened already (``open_run`` returns an open run); the worker's handle waits here."""

    def start(self) -> None:
        self._log_point()  # where the job starts: 0, or what the journal already has
        self.ticks.thread = threading.Thread(target=self._loop, name="cupid-mlflow-progress", daemon=True)
        self.ticks.thread.start()

    def instance_finished(self, instance: object, result: InstanceResult, record: Mapping[str, Any],
                          calls: CallLog | None) -> None:
        """Called on the event loop for each finished instance: cheap, never waits on MLflow."""
        with self._lock:
            self._records.append(record)
            done = len(self._records)
        if self.traces is not None and calls is not None:
            self.traces.write(instance, result, calls)
        if done - self.ticks.signalled >= max(1.0, PERCENT_STEP * self.units.total):
            self.ticks.signalled = done
            self.ticks.wake.set()

    def _loop(self) -> None:
        t = self.ticks
        while not t.stop.is_set():
            t.wake.wait(max(0.0, t.every_s - MIN_GAP_S))  # a point every every_s (the gap below included)
            t.wake.clear()
            if t.stop.is_set():
                break
            self._log_point()
            t.stop.wait(MIN_GAP_S)

    def _log_point(self) -> None:
        """One progress point if anything changed; a failure is logged and the job goes on."""
        with self._lock:
            records = list(self._records)
        failed = sum(1 for r in records if r.get("errors"))  # a point's cost is its scores, not this
        usage = read_totals(self.meter)
        done = len(records)
        batches = getattr(self.meter, "batches", None)  # calls.batch: the provider's queue, while nothing finishes
        batch_points = ({f"progress/{k}": v for k, v in batches.metrics().items() if k != "batch/rows_reused"}
                        if batches is not None and (batches.submitted or batches.pending) else {})
        state, units, t = (done, usage.get("calls", 0.0), tuple(batch_points.values())), self.units, self.ticks
        if state == t.logged:
            return
        so_far = {k: units.earlier.get(k, 0.0) + usage.get(k, 0.0)  # the whole job's, earlier attempts included
                  for k in ("calls", "prompt_tokens", "completion_tokens", "cost_usd")}
        metrics = {f"progress/{units.noun}_done": float(done), f"progress/{units.noun}_failed": float(failed),
                   "progress/fraction_done": done / units.total if units.total else 1.0,
                   "progress/calls": so_far["calls"], "progress/cost_usd": so_far["cost_usd"],
                   "progress/tokens": so_far["prompt_tokens"] + so_far["completion_tokens"],
                   "progress/seconds": self.opened.seconds_before + time.perf_counter() - t.started,
                   # rate limits: 429s met and time spent waiting on them, and each endpoint's concurrency limit
                   "progress/rate_limited": usage.get("rate_limited", 0.0),
                   "progress/limit_wait_s": usage.get("limit_wait_s", 0.0), **pool_metrics(), **batch_points}
        try:
            metrics.update(running_scores(records, units.parts, units.policy))
            self.tracker.log_metrics(metrics, step=done)
            t.logged, t.failing = state, False
        except Exception as exc:  # noqa: BLE001  # a progress point is never worth the job
            first = (str(exc).strip().splitlines() or [""])[0][:200]  # a store error carries its SQL and values
            (log.debug if t.failing else log.warning)(
                "MLflow progress point not logged: %s: %s", type(exc).__name__, first, extra=STORE_NOTE)
            t.failing = True

    def executed(self) -> None:
        """The model phase is over: rebuild missing traces and export while the job computes its numbers."""
        if self.backfill is not None:
            self.rebuilt = reopen.backfill(self, self.backfill)
            self.backfill = None
        if self.traces is not None:
            self.traces.executed()
        self.ticks.wake.set()

    def draw_plots(self) -> None:
        """Draw the run's plots from the records heard so far, while the job computes its numbers."""
        if self.plots is not None and self.drawn is None:
            with self._lock:
                records = list(self._records)
            self.drawn = self.plots.draw(records)

    def end(self, status: str, summary: Mapping[str, Any] | None = None, tags: Mapping[str, str] | None = None,
            *, published: bool = False) -> None:
        """End the run once with ``status`` and ``tags``; ``published``: wait for every trace."""
        if self.tracker.status is not None:
            return
        try:
            t = self.ticks
            if t.thread is not None:  # the progress thread stopped, and the last point logged (once)
                t.stop.set()
                t.wake.set()
                t.thread.join(30.0)
                t.thread = None
                self._log_point()
            if published:
                self._close_traces(None)
                if self.opened.resumed or self.rebuilt:  # units run again, or traces rebuilt: one trace per unit
                    reopen.one_trace_per_unit(self.tracker.client, self.tracker.experiment_id, self.run_id)
            note = f"{status} with {len(self._records)} of {self.units.total} {self.units.noun} done"
            if summary:
                note += "; " + ", ".join(f"{k} {v}" for k, v in summary.items())
            self.tracker.set_tags({**(tags or {}), f"cupid.attempt.{self.attempt}": note})
        finally:
            self.tracker.end(status)
            self.claim.release()
            self._close_traces(INTERRUPTED_FLUSH_S)  # (a published job's are closed already)

    def finish(self, final: "FinalLog") -> None:
        """The job's results into the run, then its end (FINISHED for exit 0, else FAILED)."""
        run = self.tracker
        metrics, tags = final.metrics, final.tags
        if self.opened.carried is not None:  # the usage ledger was gone: the earlier attempts' usage as the run had it
            metrics = reopen.carry_into(dict(metrics), self.opened.carried)
            tags = {**tags, reopen.CARRIED_TAG:
                    "the run's last progress point before this attempt (the ledger was gone)"}
        run.log_metrics(metrics, step=final.step)
        run.set_tags(tags)
        if final.headline and self.opened.name:
            run.client.update_run(run.run_id, name=scored_name(self.opened.name, final.headline))
        artifacts = list(final.artifacts)
        if self.drawn is not None:
            artifacts.append((self.drawn, "plots"))
        elif final.plots is not None:
            artifacts.append((final.plots.draw(final.table or []), "plots"))
        with tempfile.TemporaryDirectory(prefix="cupid-artifacts-") as tmp:
            for files, folder in artifacts:
                run.log_artifacts([_without_replies(Path(f), Path(tmp)) if f in final.without_replies else Path(f)
                                   for f in files], folder)
        if final.table is not None:
            run.log_table(records_table(final.table), "instances_table.json")
        self.end(final.status, final.summary, published=True)

    def _close_traces(self, timeout: float | None) -> None:
        """Wait for the trace backlog (``timeout`` None: while it progresses) and stop tracing."""
        if self.traces is not None:
            traces, self.traces = self.traces, None
            traces.close(timeout)


def _without_replies(path: Path, folder: Path) -> Path:
    """A copy of the records file without ``raw`` replies: the traces hold them once."""
    copy = folder / path.name
    with path.open(encoding="utf-8") as records, copy.open("w", encoding="utf-8") as out:
        for line in records:
            if line.strip():
                record = json.loads(line)
                record.pop("raw", None)
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return copy


def dataset_name(cfg: DataConfig, data: LoadedData) -> str:
    """The file's name, with the part taken for a subset (``h2.jsonl [data.limit=2]``)."""
    name = {"hf": str(cfg.hf_name), "sample": "cupid-sample"}.get(cfg.source) or Path(data.source).name or data.source
    subset = subset_of(cfg.limit, cfg.instance_types)
    return f"{name} [{subset}]" if subset else name


def dataset_digest(cfg: DataConfig, data: LoadedData) -> str:
    if not cfg.limit and not cfg.instance_types:
        return data.digest
    keys = "\n".join(i.key for i in data.instances)
    return hashlib.sha256(f"{data.digest}\n{keys}".encode()).hexdigest()[:16]


@dataclass
class DatasetInput:
    """The dataset input as plain data, turned into MLflow's entity where the run is logged."""

    name: str
    digest: str
    rows: list[dict[str, Any]]
    local_path: str | None = None  #: the file the rows came from
    hub: dict[str, Any] | None = None  #: path, split and revision on the Hugging Face Hub

    def entity(self) -> Dataset:
        """The dataset entity (``mlflow.entities.Dataset``): name, source, digest, schema and row count."""
        import mlflow.data
        import pandas as pd
        from mlflow.data.huggingface_dataset_source import HuggingFaceDatasetSource

        # a local path: MLflow makes it a "local" source
        source = HuggingFaceDatasetSource(**self.hub) if self.hub is not None else self.local_path
        with warnings.catch_warnings():  # hints meant for model signatures, and a local path "read two ways"
            warnings.simplefilter("ignore", UserWarning)
            dataset = mlflow.data.from_pandas(pd.DataFrame(self.rows), source=source, name=self.name,
                                              digest=self.digest)
            return dataset._to_mlflow_entity()


def dataset_input(cfg: DataConfig, data: LoadedData) -> DatasetInput:
    """The instances run, one row each with its key fields, with their name, digest and source."""
    rows = [{"key": i.key, "persona_id": i.persona_id, "instance_type": i.instance_type,
             "current_context_factor": i.current_context_factor, "current_request": i.current_request,
             "n_prior_sessions": len(i.prior_interactions), "n_checklist_items": len(i.current_checklist)}
            for i in data.instances]
    hub = {"path": str(cfg.hf_name), "split": cfg.split, "revision": cfg.revision} if cfg.source == "hf" else None
    return DatasetInput(dataset_name(cfg, data), dataset_digest(cfg, data), rows, hub=hub,
                        local_path=None if hub else str(Path(data.source).expanduser().resolve()))


@dataclass
class RunRequest:
    """Everything the job's MLflow run is opened with: plain data, so another process can open it."""

    tracking: TrackingConfig
    secrets: list[str]
    run_name: str
    params: dict[str, str]
    tags: dict[str, str]
    config: dict[str, Any]
    parent: str | SweepParent | None  #: a sweep's parent run, by id or by its folder (opened on first use)
    run_key: str
    exclusive: bool  #: this attempt holds the run key's lock: it may reopen an earlier attempt's run
    dataset: DatasetInput | None  #: the run's input (an evaluation's data; None: synthesis makes its own)
    units: Units
    traces: TraceRequest | None  #: None: no traces
    nothing_left: bool = False  #: every instance is journalled: a run that holds the results stays as it is
    ledger_found: bool = True  #: the job's usage ledger was there (else the run's own metrics say what was spent)
    plots: "PlotRequest | None" = None  #: drawn by the run worker when the model phase ends


@dataclass
class TraceRequest:
    """The run's trace tags, judge names and journalled units' inputs, for rebuilding missing traces."""

    tags: dict[str, str] = field(default_factory=dict)
    judges: dict[str, str] = field(default_factory=dict)
    shown: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass
class FinalLog:
    """A finished job's results for its run (``LiveRun.finish``)."""

    metrics: dict[str, float]
    step: int
    tags: dict[str, str]
    artifacts: list[tuple[list[str], str | None]]  #: (files, artifact folder)
    table: list[dict[str, Any]] | None  #: the per-instance records (scrubbed), as the run's table
    summary: dict[str, Any]  #: the attempt's one-line note
    status: str = "FINISHED"  #: how the run ends (``run_outcomes.status_of`` the job's outcome)
    totals: dict[str, float] = field(default_factory=dict)  #: the meter's last totals (a worker's final point)
    plots: PlotRequest | None = None  #: drawn where the run is kept, then logged under plots/
    without_replies: list[str] = field(default_factory=list)  #: artifacts logged without their records' replies
    headline: str = ""  #: the results at a glance: after the run's name (``mlflow.scored_name``)


@dataclass
class PlotRequest:
    """The run's plots, drawn by the run worker from records in dataset order (as the job's table)."""

    parts: tuple[str, ...]
    folder: str
    seed: int
    failure_policy: str
    title_prefix: str
    order: tuple[str, ...] = ()

    def draw(self, records: Sequence[Mapping[str, Any]]) -> list[str]:
        from cupid_exp.reporting.plots import save_run_plots

        if self.order:
            rank = {key: i for i, key in enumerate(self.order)}
            records = sorted(records, key=lambda r: rank.get(r.get("key"), len(rank)))

        return [str(p) for p in save_run_plots(records, self.parts, self.folder, seed=self.seed,
                                               failure_policy=self.failure_policy, title_prefix=self.title_prefix)]


def open_run(request: RunRequest, claim: Claim, meter: Totals) -> LiveRun | FinishedEarlier:
    """Open (or reopen) the run with its params, tags, config and dataset, and start its progress thread; a done job
    whose earlier run holds its results gets that run untouched."""
    from cupid_exp.tracking import traces as tracing

    tracker = RunTracker(request.tracking, request.secrets)
    previous = reopen.earlier_run(tracker.client, tracker.experiment_id, request.run_key) if request.exclusive else None
    parent = parent_of(request.tracking, request.parent)
    if request.nothing_left and reopen.holds_results(previous):
        return reopen.leave_finished(tracker, request, previous, parent, claim)
    tags = {**request.tags, **reopen.attempt_tags(previous, request.run_key)}
    carried, notice = reopen.carried_usage(previous, request.ledger_found)
    try:
        tracker.start(run_name=request.run_name, params=request.params, parent=parent, config=request.config,
                      tags=tags, resume=previous.info.run_id if previous is not None else None)
        if request.dataset is not None:
            tracker.log_input(request.dataset.entity())
        traces = None
        if request.traces is not None:
            tracing.setup(request.tracking.uri)
            trace_tags = {**request.traces.tags, reopen.ATTEMPT_TAG: tags["cupid.attempt"]}
            traces = tracing.TraceWriter(tracker.experiment_id, tracker.run_id, trace_tags, request.traces.judges,
                                         request.secrets)
        units = replace(request.units, earlier={**request.units.earlier, **(carried or {})})
        live = LiveRun(tracker, claim, units, meter=meter, every_s=request.tracking.progress_every_s, traces=traces,
                       attempt=tags["cupid.attempt"], plots=request.plots)
        live.notice, live.backfill = notice, request
        live.opened = Opened(request.run_name, carried, previous is not None,
                             previous.data.metrics.get("progress/seconds", 0.0) if previous is not None else 0.0)
        reopen.leave_no_empty_parent(tracker.client, tracker.experiment_id, previous, parent)
        live.start()
    except BaseException as exc:  # an interrupt or a store error while opening: never leave it RUNNING
        tracker.end("KILLED" if isinstance(exc, (KeyboardInterrupt, Terminated)) else "FAILED")
        raise
    return live
