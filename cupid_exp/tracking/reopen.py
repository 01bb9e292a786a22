"""What a job's MLflow run takes over from earlier attempts (one run per job, found by ``cupid.run_key``): a done job
keeps its run untouched; a reopened run gets missing traces rebuilt, one trace per unit, no empty parent left, and
usage carried when its ledger is gone; a SIGKILLed attempt is noted."""

from __future__ import annotations

import logging
from collections import defaultdict
from types import SimpleNamespace
from typing import TYPE_CHECKING, Mapping, Sequence

from cupid_exp.errors import first_line
from cupid_exp.run_outcomes import DESCRIPTION_TAG, OUTCOME_TAG
from cupid_exp.tracking.mlflow import link_name

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run, TraceInfo

    from cupid_exp.durability.attempts import Claim
    from cupid_exp.tracking.live import LiveRun, PlotRequest, RunRequest
    from cupid_exp.tracking.mlflow import RunTracker

log = logging.getLogger(__name__)

LINK_KIND = "link"  #: ``cupid.kind`` of a sweep's child run that stands for a job finished earlier
LINKS_TO = "cupid.links_to"  #: the run id such a link stands for
CARRIED_TAG = "cupid.earlier_usage"  #: where a run's earlier attempts' usage came from, when not the ledger
ATTEMPT_TAG = "cupid.attempt"  #: on a trace: the attempt of the run that wrote it


def earlier_run(client: MlflowClient, experiment_id: str, key: str) -> Run | None:
    """The latest run of ``key`` in the experiment, any status (None when there is none)."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.`cupid.run_key` = '{key}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


def attempt_tags(previous: Run | None, key: str) -> dict[str, str]:
    """``cupid.run_key`` and the attempt number; a previous attempt left RUNNING died without ending its run."""
    if previous is None:
        return {"cupid.run_key": key, ATTEMPT_TAG: "1"}
    before = int(previous.data.tags.get(ATTEMPT_TAG, "1"))
    tags = {"cupid.run_key": key, ATTEMPT_TAG: str(before + 1)}
    if previous.info.status == "RUNNING" and f"cupid.attempt.{before}" not in previous.data.tags:
        tags[f"cupid.attempt.{before}"] = "the process died without ending the run (e.g. SIGKILL)"
    return tags


def holds_results(run: Run | None) -> bool:
    """Whether an earlier run ended with the job's results: FINISHED, or FAILED for too many failed instances."""
    if run is None:
        return False
    outcome = run.data.tags.get(OUTCOME_TAG)
    if run.info.status == "FINISHED":
        return outcome in (None, "ok")
    return run.info.status == "FAILED" and outcome == "incomplete"


class FinishedEarlier:
    """The job's handle on a run that finished earlier: nothing is written to it."""

    traces = None
    wants_calls = False
    reused = True

    def __init__(self, run: Run, claim: Claim, notice: str, plots: PlotRequest | None,
                 records: Sequence[Mapping[str, object]]):
        self.run_id, self.attempt = run.info.run_id, run.data.tags.get("cupid.attempt", "1")
        self.claim, self.notice, self.plots, self.drawn = claim, notice, plots, None
        self._records = list(records)

    def wait_opened(self) -> None:
        """Found already."""

    def instance_finished(self, *args: object) -> None:
        """(Nothing is left to run.)"""

    def executed(self) -> None:
        """(Nothing to export.)"""

    def draw_plots(self) -> None:
        if self.plots is not None and self.drawn is None:
            self.drawn = self.plots.draw(self._records)

    def finish(self, final: object) -> None:
        self.draw_plots()
        self.end()

    def end(self, *args: object, **kwargs: object) -> None:
        self.claim.release()


def leave_finished(tracker: RunTracker, request: RunRequest, previous: Run, parent: str | None,
                   claim: Claim) -> FinishedEarlier:
    """The job is done and ``previous`` holds its results: leave it; in a sweep, link to it from a child run."""
    run_id = previous.info.run_id
    notice = f"this job finished earlier, in MLflow run {run_id} ({previous.info.status}): left as it was"
    if parent and previous.data.tags.get("mlflow.parentRunId") != parent:
        client = tracker.client
        link = client.create_run(tracker.experiment_id, run_name=link_name(request.run_name, run_id), tags={
            "cupid.kind": LINK_KIND, LINKS_TO: run_id, "mlflow.parentRunId": parent,
            "job_identity": request.tags.get("job_identity", ""),
            DESCRIPTION_TAG: f"This job finished earlier, in run {run_id}: its results, traces and curves are there."})
        client.set_terminated(link.info.run_id, status="FINISHED")
        notice += f"; this sweep links to it (run {link.info.run_id})"
    return FinishedEarlier(previous, claim, notice, request.plots, request.units.done)


def carried_usage(previous: Run | None, ledger_found: bool) -> tuple[dict[str, float] | None, str | None]:
    """The earlier attempts' usage from the run's last progress point when the ledger is gone, with a line saying so."""
    if previous is None or ledger_found:
        return None, None
    metrics, run_id = previous.data.metrics, previous.info.run_id
    if "progress/calls" not in metrics:
        return None, (f"the job's usage ledger is gone and MLflow run {run_id} has no usage to carry: what its earlier "
                      "attempts spent is lost")
    calls, cost = metrics.get("progress/calls", 0.0), metrics.get("progress/cost_usd", 0.0)
    if not calls and not cost:  # they spent nothing
        return None, None
    carried = {"calls": calls, "cost_usd": cost, "prompt_tokens": metrics.get("progress/tokens", 0.0),
               "completion_tokens": 0.0}
    return carried, (f"the job's usage ledger is gone: its earlier attempts' {calls:g} calls and ${cost:.4f} are "
                     f"carried from MLflow run {run_id}'s progress metrics (their tokens per step are not known)")


def carry_into(metrics: dict[str, float], carried: Mapping[str, float]) -> dict[str, float]:
    """A run's final metrics with the carried calls and cost as the earlier attempts' (the ledger's are none)."""
    for name, field in (("calls/total", "calls"), ("cost/usd", "cost_usd")):
        earlier = float(carried.get(field, 0.0))
        this = float(metrics.get(f"{name}/this_attempt", metrics.get(name, 0.0)))
        metrics.update({name: this + earlier, f"{name}/earlier_attempts": earlier, f"{name}/this_attempt": this})
    return metrics


def run_traces(client: MlflowClient, experiment_id: str, run_id: str) -> list[TraceInfo]:
    """The run's traces' infos (no spans)."""
    infos: list[TraceInfo] = []
    token = None
    while True:
        page = client.search_traces(locations=[experiment_id], run_id=run_id, include_spans=False, max_results=500,
                                    page_token=token)
        infos += [t.info for t in page]
        token = page.token
        if not token:
            return infos


def one_trace_per_unit(client: MlflowClient, experiment_id: str, run_id: str) -> int:
    """Delete all but one trace per unit (the journalled one's); returns how many. Failures only warn."""
    try:
        by_key: dict[str, list[TraceInfo]] = defaultdict(list)
        for info in run_traces(client, experiment_id, run_id):
            if "cupid.key" in info.tags:
                by_key[info.tags["cupid.key"]].append(info)
        # the best kept, the first of equals (a stable sort keeps their order, reversed too)
        extra = [info.trace_id for infos in by_key.values() for info in sorted(infos, key=_rank, reverse=True)[1:]]
        for i in range(0, len(extra), 100):
            client.delete_traces(experiment_id, trace_ids=extra[i:i + 100])
        return len(extra)
    except Exception as exc:  # noqa: BLE001 - a duplicate trace is never worth the run's end
        log.warning("MLflow: the run's traces were not checked for duplicates (%s: %s)", type(exc).__name__,
                    first_line(exc))
        return 0


def _rank(info: TraceInfo) -> tuple[bool, int, int]:
    attempt = str(info.tags.get(ATTEMPT_TAG, "0"))
    return (not info.tags.get("cupid.rebuilt"), int(attempt) if attempt.isdigit() else 0, info.request_time or 0)


def leave_no_empty_parent(client: MlflowClient, experiment_id: str, previous: Run | None, parent: str | None) -> None:
    """Leave an old sweep parent; delete it if ended and childless. Never fails."""
    before = previous.data.tags.get("mlflow.parentRunId") if previous is not None else None
    if not before or not parent or before == parent:
        return
    try:
        old = client.get_run(before)
        if old.data.tags.get("cupid.kind") != "sweep" or old.info.status == "RUNNING" \
                or old.info.lifecycle_stage != "active":
            return
        if not client.search_runs([experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{before}'",
                                  max_results=1):
            client.delete_run(before)
            log.info("MLflow: sweep run %s has no job left (they moved to sweep run %s): deleted", before, parent)
    except Exception as exc:  # noqa: BLE001 - an empty parent is never worth the job
        log.warning("MLflow: the earlier sweep run %s was not checked for jobs left (%s: %s)", before,
                    type(exc).__name__, first_line(exc))


def backfill(live: LiveRun, request: RunRequest) -> int:
    """Rebuild the trace of every journalled instance lacking one; returns how many (a failing store: one warning)."""
    shown = request.traces.shown if request.traces is not None else {}
    if live.traces is None or not request.units.done:
        return 0
    try:
        have = {info.tags.get("cupid.key") for info in run_traces(live.tracker.client, live.tracker.experiment_id,
                                                                  live.run_id)}
    except Exception as exc:  # noqa: BLE001 - traces are never worth the job
        log.warning("MLflow: the run's traces could not be listed, none rebuilt (%s: %s)", type(exc).__name__,
                    first_line(exc))
        return 0
    missing = [record for record in request.units.done if record.get("key") in shown and record["key"] not in have]
    for record in missing:
        current_request, factor = shown[record["key"]]
        live.traces.write_record(SimpleNamespace(current_request=current_request, current_context_factor=factor),
                                 record, tuple(request.units.parts))
    if missing:
        log.info("MLflow: %d traces rebuilt from the journal for run %s", len(missing), live.run_id)
    return len(missing)
