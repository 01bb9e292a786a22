"""The report's one tidy frame: a row per number with its interval; every table is a pivot of it."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import pandas as pd

from cupid_exp.reporting.reference import GROUPS, paper_rows
from cupid_exp.reporting.runs import JobRun
from cupid_exp.reporting.selection import Selection
from cupid_exp.scoring.bootstrap import DEFAULT_N_BOOT, Estimate, bootstrap_ci
from cupid_exp.scoring.names import metric_key
from cupid_exp.scoring.statistics import TASK_METRICS

COLUMNS = ["source", "reference", "matcher", "run_id", "data", "evaluator", "model", "conf_model", "setting", "task",
           "group", "metric", "value", "ci_low", "ci_high", "n", "note"]


def estimate(run: JobRun, records: Sequence[Mapping[str, Any]] | None, task: str, group: str, metric: str, *,
             n_boot: int, seed: int) -> tuple[Estimate | None, str | None]:
    """The logged metric with the interval from the records, and a note when they disagree."""
    key = metric_key(task, group, metric)
    logged = run.metrics.get(key)
    if records is None:
        if logged is None:
            return None, None
        n = run.metrics.get(metric_key(task, group, "n"), 0)
        return Estimate(metric, logged, math.nan, math.nan, int(n), 0, n_boot=n_boot, seed=seed), None
    part = records if group == "all" else [r for r in records if r.get("instance_type") == group]
    est = bootstrap_ci(part, metric, n_boot=n_boot, seed=seed, failure_policy=run.failure_policy)
    if est.n == 0 and logged is None:
        return None, None
    if logged is not None and est.n and abs(logged - est.value) > 1e-6:
        note = (f"run {run.short}: logged {key} = {logged:.4f}, but its instances.jsonl gives {est.value:.4f} "
                f"(policy {run.failure_policy}); showing the logged value")
        return Estimate(metric, logged, est.low, est.high, est.n, est.n_clusters, est.level, n_boot, seed), note
    return est, None


def run_rows(selection: Selection, *, n_boot: int = DEFAULT_N_BOOT, seed: int = 0) -> pd.DataFrame:
    """Every selected run's numbers: each task it ran × overall and per type × each of the task's metrics."""
    rows = []
    for run in selection.runs:
        records = selection.records.get(run.run_id)
        for task in run.tasks:
            for group in GROUPS:
                for metric in TASK_METRICS[task]:
                    est, note = estimate(run, records, task, group, metric, n_boot=n_boot, seed=seed)
                    if est is not None:
                        rows.append({"source": "run", "run_id": run.run_id, "data": run.data_label,
                                     "evaluator": run.evaluator, "model": run.model, "setting": run.setting_label,
                                     "task": task, "group": group, "metric": metric, "value": est.value,
                                     "ci_low": est.low, "ci_high": est.high, "n": est.n, "note": note})
    return pd.DataFrame(rows, columns=COLUMNS)


def tidy_frame(selection: Selection, reference: Mapping[str, Any] | None = None, *, n_boot: int = DEFAULT_N_BOOT,
               seed: int = 0) -> pd.DataFrame:
    parts = [run_rows(selection, n_boot=n_boot, seed=seed)]
    if reference is not None:
        parts.append(paper_rows(reference).reindex(columns=COLUMNS))
    filled = [p for p in parts if not p.empty]
    frame = pd.concat(filled, ignore_index=True) if filled else pd.DataFrame(columns=COLUMNS)
    return frame.astype({"n": "Int64"})
