"""Paired comparison of two runs (B − A) on the instances both scored, overall and per instance type."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Mapping, Sequence

import pandas as pd

from cupid_exp.reporting.reference import GROUPS
from cupid_exp.reporting.runs import EPOCHS_NOTE, JobRun, common_policy, identity_diff
from cupid_exp.reporting.tables import SCALE, Table
from cupid_exp.scoring.bootstrap import DEFAULT_N_BOOT, DEFAULT_N_PERM, MAX_EXACT_PERSONAS, paired_compare
from cupid_exp.scoring.names import metric_key
from cupid_exp.scoring.statistics import HEADLINE, TASK_METRICS, task_frame

Records = Sequence[Mapping[str, Any]]
HEADER = ["task", "instances", "metric", "A", "B", "B − A", "95% CI", "p", "shared (personas)", "only A", "only B"]


def _tasks(run_a: JobRun, records_a: Records, run_b: JobRun, records_b: Records) -> list[str]:
    """The tasks both runs have numbers for; failing that, those both runs' records carry a scored instance of."""
    tasks = [t for t in TASK_METRICS if t in run_a.tasks and t in run_b.tasks]
    return tasks or [t for t in TASK_METRICS
                     if not task_frame(records_a, t).empty and not task_frame(records_b, t).empty]


def differs(run_a: JobRun, run_b: JobRun) -> str:
    """'differs: model.params.temperature: 0 → 0.4; ...': the two runs' differences."""
    said = identity_diff(run_a.identity, run_b.identity)
    if run_a.tasks != run_b.tasks:
        said.append(f"task: {', '.join(run_a.tasks)} → {', '.join(run_b.tasks)}")
    if run_a.data_id != run_b.data_id:  # its content and subset, not only its name
        said.append(f"data: {run_a.data_label} → {run_b.data_label}")
    return "differs: " + ("; ".join(said) or "nothing that decides a score (the same experiment, run twice)")


def compare_runs(run_a: JobRun, records_a: Records, run_b: JobRun, records_b: Records, *,
                 n_boot: int = DEFAULT_N_BOOT, seed: int = 0) -> Table:
    """Paired comparison B − A on the instances both runs scored, overall and per instance type."""
    policy = common_policy([run_a, run_b])
    title = (f"Paired comparison: B − A on shared instances (95% paired cluster-bootstrap CI; "
             f"sign-flip permutation p over personas) — A = {run_a.describe()}, B = {run_b.describe()}")
    rows, long = [], []
    for task in _tasks(run_a, records_a, run_b, records_b):
        factor, digits = SCALE[task]
        for group in GROUPS:
            ra = records_a if group == "all" else [r for r in records_a if r.get("instance_type") == group]
            rb = records_b if group == "all" else [r for r in records_b if r.get("instance_type") == group]
            if not ra or not rb:
                continue
            for metric in (TASK_METRICS[task] if group == "all" else (HEADLINE[task],)):
                c = paired_compare(ra, rb, metric, n_boot=n_boot, seed=seed, failure_policy=policy)
                if c.n_shared == 0:
                    continue
                rows.append([task, group, metric, f"{c.a * factor:.{digits}f}", f"{c.b * factor:.{digits}f}",
                             f"{c.diff * factor:+.{digits}f}",
                             f"[{c.low * factor:+.{digits}f}, {c.high * factor:+.{digits}f}]",
                             f"{c.p_value:.3g}" + ("" if c.p_exact else "*"), f"{c.n_shared} ({c.n_clusters})",
                             str(c.only_a), str(c.only_b)])
                long.append({"table": "compare", "task": task, "instances": group, **asdict(c),
                             "run_a": run_a.run_id, "run_b": run_b.run_id})
    frame = pd.DataFrame(rows, columns=HEADER)
    notes = []
    if frame.empty:
        notes.append("the two runs share no scored instances")
    if frame["p"].str.endswith("*").any():
        notes.append(f"* p from {DEFAULT_N_PERM:,} random sign patterns (exact enumeration when ≤ "
                     f"{MAX_EXACT_PERSONAS} personas)")
    if run_a.epochs > 1 or run_b.epochs > 1:
        notes.append(f"epochs: A {run_a.epochs}, B {run_b.epochs}; epoch e of A is paired with epoch e of B, and "
                     f"{EPOCHS_NOTE.removeprefix('epochs=K rows: ')}")
    if run_a.failure_policy != run_b.failure_policy:
        notes.append("the runs used different failure policies; compared with failures excluded")
    notes.append(f"{differs(run_a, run_b)}; full config diff: python -m cupid_exp.diff {run_a.run_id} {run_b.run_id}")
    return Table(title, frame, pd.DataFrame(long), notes)


def best_two(runs: Sequence[JobRun]) -> tuple[JobRun, JobRun] | None:
    """The runs of the first table's two best rows (second, best; standard setting first); None if none."""
    for task in TASK_METRICS:
        key = metric_key(task, "all", HEADLINE[task])
        for data, evaluator in sorted({(r.data_label, r.evaluator) for r in runs}):
            here = [r for r in runs if task in r.tasks and r.data_label == data and r.evaluator == evaluator
                    and key in r.metrics]
            standard = [r for r in here if r.setting_label == "standard"]
            ranked = sorted(standard if len(standard) >= 2 else here, key=lambda r: r.metrics[key], reverse=True)
            if len(ranked) >= 2:
                return ranked[1], ranked[0]
    return None
