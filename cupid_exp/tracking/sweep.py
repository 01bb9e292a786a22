"""A sweep's parent run as its front page: leaderboard and plots of its finished runs (docs/mlflow.md)."""

from __future__ import annotations

import logging
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger(__name__)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:60]


def publish_sweep(client: MlflowClient, uri: str, experiment: str, parent_id: str, *, seed: int = 0,
                  n_boot: int = 1000) -> dict[str, float]:
    """Log the sweep's leaderboard and plots on its parent run; returns the metrics logged there."""
    from mlflow.entities import Metric

    from cupid_exp.reporting.build import best_two, build_report, compare_runs
    from cupid_exp.reporting.plots import save_report_plots
    from cupid_exp.reporting.render import render
    from cupid_exp.reporting.runs import load_records, search_job_runs
    from cupid_exp.reporting.selection import select_runs

    children = search_job_runs(uri, experiment, f"tags.`mlflow.parentRunId` = '{parent_id}'")
    linked = linked_runs(client, parent_id)  # jobs of this sweep that had finished earlier, in runs of their own
    if linked:
        ids = ", ".join(f"'{run_id}'" for run_id in linked)
        children += search_job_runs(uri, experiment, f"attributes.run_id IN ({ids})")
    selection = select_runs(children, lambda run_id: load_records(uri, run_id, cache_dir=None))
    tables = build_report(selection, n_boot=n_boot, seed=seed) if selection.runs else []
    notes = list(selection.notes) + [f"{len(children)} job runs in this sweep, {len(selection.runs)} in the tables",
                                     f"95% intervals: cluster bootstrap over personas, {n_boot} resamples, seed {seed}"]
    pair = best_two(selection.runs)
    if pair is not None and all(selection.records.get(r.run_id) for r in pair):  # its two best rows, paired
        a, b = pair
        tables.append(compare_runs(a, selection.records[a.run_id], b, selection.records[b.run_id], n_boot=n_boot,
                                   seed=seed))
        notes.append(f"the last table pairs the two best rows: python -m cupid_exp.report --compare {a.short} "
                     f"{b.short}")
    client.log_text(parent_id, render(tables, notes, "markdown"), "leaderboard.md")
    for i, table in enumerate(tables, start=1):
        client.log_table(parent_id, data=table.frame.astype(str),
                         artifact_file=f"leaderboard/{i:02d}_{_slug(table.title)}.json")
    with tempfile.TemporaryDirectory() as tmp:
        plots = save_report_plots(selection, Path(tmp), n_boot=n_boot, seed=seed) if selection.runs else []
        for path in plots:
            client.log_artifact(parent_id, str(path), artifact_path="plots")
        images = [(path.stem, path.read_bytes()) for path in plots]  # the page carries its plots
        client.log_text(parent_id, render(tables, notes, "html", images), "leaderboard.html")
    metrics = {"sweep/jobs": float(len(children)), "sweep/jobs_in_tables": float(len(selection.runs)),
               "sweep/jobs_finished": float(sum(r.status == "FINISHED" for r in children))}
    now = int(time.time() * 1000)
    client.log_batch(parent_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
    return metrics


def linked_runs(client: MlflowClient, parent_id: str) -> list[str]:
    """The runs this sweep's link runs stand for (``tracking.reopen``: a job done before the sweep keeps its run)."""
    from cupid_exp.tracking.reopen import LINK_KIND, LINKS_TO

    parent = client.get_run(parent_id)
    links = client.search_runs([parent.info.experiment_id], max_results=1000, filter_string=(
        f"tags.`mlflow.parentRunId` = '{parent_id}' and tags.`cupid.kind` = '{LINK_KIND}'"))
    return sorted({r.data.tags[LINKS_TO] for r in links if r.data.tags.get(LINKS_TO)})


@dataclass
class SweepEnd:
    """What ending a sweep's parent run needs: plain data, so that the sweep's run worker can do it."""

    uri: str
    experiment: str
    sweep_dir: str
    seed: int
    failed: bool  #: a job of the sweep failed: the parent ends FAILED


def finish_sweep(end: SweepEnd) -> str | None:
    """Log the leaderboard on the sweep's parent and end it; returns why it could not, if so."""
    from mlflow.tracking import MlflowClient

    from cupid_exp.durability.signals import shielded
    from cupid_exp.reporting.runs import env_uri_kept
    from cupid_exp.tracking.mlflow import parent_run_id

    parent = parent_run_id(end.sweep_dir)
    if parent is None:  # no job opened a run (and with it the parent)
        return None
    client = MlflowClient(end.uri)
    problem = None
    try:
        with env_uri_kept():  # the report's queries set MLflow's global URI
            publish_sweep(client, end.uri, end.experiment, parent, seed=end.seed)
    except Exception as exc:  # noqa: BLE001  # the leaderboard is a view; the jobs' runs hold the results
        problem = f"{type(exc).__name__}: {exc}"
    with shielded():
        client.set_terminated(parent, status="FAILED" if end.failed else "FINISHED")
    return problem
