"""A whole report from a selection of runs: its one tidy frame (a row per number with its interval), the paper-layout
leaderboards and the by-setting tables pivoted from it, and the paper's tables left over; and the paired comparison of
two runs (B − A) on the instances both scored, overall and per instance type."""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from cupid_exp.reporting.runs import EPOCHS_NOTE, JobRun, common_policy, identity_diff
from cupid_exp.reporting.selection import Selection
from cupid_exp.reporting.tables import (
    GROUPS,
    PAPER_COLUMNS,
    SCALE,
    Table,
    extra_settings,
    long_rows,
    matcher_of,
    model_of,
    n_cell,
    natural,
    notes_of,
    ordered,
    paper_rows,
    run_numbers,
    runs_by_model,
    setting_order,
    unfinished_table,
    with_text,
)
from cupid_exp.scoring.bootstrap import (
    DEFAULT_N_BOOT,
    DEFAULT_N_PERM,
    MAX_EXACT_PERSONAS,
    Estimate,
    bootstrap_ci,
    paired_compare,
)
from cupid_exp.scoring.names import metric_key
from cupid_exp.scoring.statistics import HEADLINE, TASK_METRICS, task_frame

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


def build_report(selection: Selection, *, reference: Mapping[str, Any] | None = None, n_boot: int = DEFAULT_N_BOOT,
                 seed: int = 0) -> list[Table]:
    """The leaderboards of every data set × evaluator selected; with ``reference``, the paper's rows beside them."""
    tidy = tidy_frame(selection, reference, n_boot=n_boot, seed=seed)
    tables: list[Table] = []
    shown: set[tuple[str, bool, str]] = set()
    for data, evaluator in sorted({(r.data_label, r.evaluator) for r in selection.runs}):
        for task in TASK_METRICS:
            for by_type in (False, True):
                table = leaderboard(tidy, selection.runs, task, data=data, evaluator=evaluator,
                                    summary_by_type=by_type)
                if table is not None and (table.frame["source"] == "run").any():
                    tables.append(table)
                    shown.add((task, by_type, matcher_of(evaluator)))
            table = setting_table(tidy, selection.runs, task, data=data, evaluator=evaluator)
            if table is not None:
                tables.append(table)
    if reference is not None:
        for task in TASK_METRICS:
            for by_type in (False, True):
                for matcher in ("gpt4o", "prefmatcher"):
                    if (task, by_type, matcher) in shown or (task == "generation" and matcher != "gpt4o"):
                        continue
                    table = leaderboard(tidy, [], task, data=None, evaluator=matcher, summary_by_type=by_type)
                    if table is not None and len(table.frame):
                        shown.add((task, by_type, matcher))
                        tables.append(table)
    if selection.unfinished:  # above the plots, with its data and reason; rows of the CSV too
        tables.append(unfinished_table(selection.unfinished))
    return tables


LEADERBOARD_UNITS = {"inference": "P / R / F1 in %", "generation": "mean judge score 1–10"}


def _reference_title(paper: pd.DataFrame, summary_by_type: bool) -> str:
    """'Table 1, Table 9 (summary)': the paper tables a leaderboard's paper rows come from."""
    if paper.empty:
        return ""
    marked = paper["reference"].where(summary_by_type | (paper["setting"] != "summary"),
                                      paper["reference"] + " (summary)")
    return ", ".join(dict.fromkeys(marked))


def _row_order(models: Sequence[str], paper: pd.DataFrame) -> list[str]:
    """Each model's rows, followed by its paper row when the paper has one; then the paper's other rows."""
    paper_label = dict(zip(paper["conf_model"], paper["model"], strict=False))
    order: list[str] = []
    for model, rows in itertools.groupby(models, key=model_of):
        order += rows
        if model in paper_label:
            order.append(f"paper: {paper_label[model]}")
    order += [f"paper: {label}" for label in dict.fromkeys(paper["model"]) if f"paper: {label}" not in order]
    return order


def _cells(numbers: pd.DataFrame, order: Sequence[str], columns: Sequence[str], metrics: Sequence[str]) -> pd.DataFrame:
    """A row per line of ``order``, a text cell per column: its metrics joined ('P / R / F1'), '–' when none."""
    texts = numbers.pivot(index="row", columns=["column", "metric"], values="text")
    texts = texts.reindex(index=list(order), columns=pd.MultiIndex.from_product([columns, metrics]))
    texts = texts.astype(object).fillna("–")
    joined = pd.DataFrame({c: texts[c].agg(" / ".join, axis=1) for c in columns}, index=texts.index)
    return joined.replace(" / ".join(["–"] * len(metrics)), "–")


def leaderboard(tidy: pd.DataFrame, runs: Sequence[JobRun], task: str, *, data: str | None, evaluator: str,
                summary_by_type: bool = False) -> Table | None:
    """One paper-layout table (``summary_by_type``: Tables 9/10); ``data=None``: the paper's rows alone."""
    by_model = runs_by_model(task, runs, data, evaluator)
    base = "summary" if summary_by_type else "standard"
    columns = list(GROUPS) if summary_by_type else [
        *PAPER_COLUMNS[task], *extra_settings(label for settings in by_model.values() for label in settings)]
    # column -> the (setting, group) it shows: a group of the base setting, or another setting's 'all'
    source = pd.DataFrame([(c, base, c) if c in GROUPS else (c, c, "all") for c in columns],
                          columns=["column", "setting", "group"])
    by_model = {m: s for m, s in by_model.items() if set(source["setting"]) & set(s)}
    runs_part = run_numbers(tidy, task, by_model)
    # the paper's numbers scored with the matcher ``evaluator`` stands for (any, for generation)
    paper = tidy[(tidy["source"] == "paper") & (tidy["task"] == task)]
    paper = paper[paper["matcher"].isna() | (paper["matcher"] == matcher_of(evaluator))].merge(
        source, on=["setting", "group"])
    if not by_model and paper.empty:
        return None
    ref_title = _reference_title(paper, summary_by_type)
    numbers = pd.concat([runs_part.merge(source, on=["setting", "group"]).assign(row=lambda f: f["model"]),
                         paper.assign(row="paper: " + paper["model"], reference=ref_title)], ignore_index=True)
    numbers = with_text(numbers, task)
    metrics = TASK_METRICS[task]
    order = _row_order(sorted(by_model, key=natural), paper)
    what = "with summaries, by instance type" if summary_by_type else "by model"
    title = (f"Paper reference ({ref_title}): {task} {what} ({LEADERBOARD_UNITS[task]})" if data is None else
             f"{task.capitalize()} {what} — data={data}, evaluator={evaluator} ({LEADERBOARD_UNITS[task]}; [95% CI])")
    frame = _cells(numbers, order, columns, metrics)
    frame.insert(0, "model", frame.index)
    frame.insert(1, "source", ["run" if row in by_model else f"paper: {ref_title}" for row in order])
    if data is not None:
        frame["n (all)"] = [_n_all(numbers, by_model, row, base, task) for row in order]
        frame["runs"] = [_runs_cell(by_model.get(row), source["setting"]) for row in order]
    numbers = ordered(numbers, {"row": order, "column": columns, "metric": metrics})
    notes = notes_of(numbers)
    shown = [run for settings in by_model.values() for run in settings.values()]
    if not paper.empty and shown and any(run.data != "cupid" or run.subset for run in shown):
        notes.append(f"data={data} is not the whole CUPID benchmark: the paper rows are not comparable with these "
                     f"runs")
    return Table(title, frame.reset_index(drop=True), long_rows(numbers, title, task), notes)


def _runs_cell(settings: dict[str, JobRun] | None, shown: Sequence[str]) -> str:
    """The short ids of the runs a model's row shows, in column order (the paper's rows have none)."""
    return "" if settings is None else " ".join(dict.fromkeys(settings[s].short for s in shown if s in settings))


def _n_all(numbers: pd.DataFrame, by_model: dict[str, dict[str, JobRun]], row: str, base: str, task: str) -> str:
    """Instances behind the 'all' column of a model's row: scored, and of how many when some were not."""
    run = by_model.get(row, {}).get(base)
    if run is None:
        return ""
    shown = numbers[(numbers["row"] == row) & (numbers["column"] == "all")]
    return n_cell(int(shown["n"].max()) if len(shown) else 0, run.instances(task))


RECOVERED = "oracle gain recovered"
RECOVERED_COLUMNS = [RECOVERED, *(f"recovered: {g}" for g in GROUPS[1:])]
SETTING_UNITS = {"inference": "F1 in %", "generation": "mean judge score 1–10"}


def recovered_shares(values: pd.DataFrame) -> pd.DataFrame:
    """(setting − standard) / (oracle − standard) per row and column; NaN where undefined."""
    models = values.index.get_level_values("model")
    settings = values.index.get_level_values("setting")

    def baseline(label: str) -> np.ndarray:
        rows = values[settings == label].droplevel("setting")
        return rows.reindex(models).to_numpy(dtype=float)

    standard, oracle = baseline("standard"), baseline("oracle")
    gap = oracle - standard
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = (values.to_numpy(dtype=float) - standard) / np.where(np.abs(gap) < 1e-12, np.nan, gap)
    shares[np.isin(settings, ["standard", "oracle"])] = np.nan
    return pd.DataFrame(shares, index=values.index, columns=values.columns)


def setting_table(tidy: pd.DataFrame, runs: Sequence[JobRun], task: str, *, data: str, evaluator: str) -> Table | None:
    """Headline metric by model × setting × type with the oracle gain recovered; None if only standard ran."""
    by_model = runs_by_model(task, runs, data, evaluator)
    if not any(label != "standard" for settings in by_model.values() for label in settings):
        return None
    metric = HEADLINE[task]
    title = (f"{task.capitalize()} by setting and instance type — data={data}, evaluator={evaluator} "
             f"({SETTING_UNITS[task]}; [95% CI])")
    models = sorted(by_model, key=natural)
    index = pd.MultiIndex.from_tuples([(m, label) for m in models
                                       for label in sorted(by_model[m], key=setting_order)], names=["model", "setting"])
    run_of = {key: by_model[key[0]][key[1]] for key in index}
    numbers = with_text(run_numbers(tidy, task, by_model), task)
    numbers = numbers[numbers["metric"] == metric]
    fields = ["text", "value", "n"]
    wide = numbers.pivot(index=["model", "setting"], columns="group", values=fields).reindex(
        index=index, columns=pd.MultiIndex.from_product([fields, GROUPS], names=[None, "group"]))
    shares = recovered_shares(wide["value"])
    frame = wide["text"].astype(object).fillna("–").join(
        shares.map(lambda s: "" if pd.isna(s) else f"{100 * s:.0f}%").set_axis(RECOVERED_COLUMNS, axis=1))
    frame["n (all)"] = [n_cell(0 if pd.isna(n) else int(n), run_of[key].instances(task))
                        for key, n in wide["n"]["all"].items()]
    frame["run"] = [run_of[key].short for key in index]
    derived = shares.stack().dropna().rename("value").reset_index().assign(
        source="derived", metric="oracle_gain_recovered", data=data)
    derived["run_id"] = [run_of[key].run_id for key in zip(derived["model"], derived["setting"], strict=False)]
    long = ordered(pd.concat([derived, numbers], ignore_index=True),
                   {"model": models, "setting": sorted(set(index.get_level_values("setting")),
                                                                 key=setting_order)})
    notes = notes_of(numbers)
    notes.append(f"{RECOVERED} = (setting − standard) / (oracle − standard) of the {metric} point values, same model "
                 "and instance type, on this table's data only; blank without both a standard and an oracle run or "
                 "when their gap is 0; no interval")
    return Table(title, frame.reset_index(), long_rows(long.rename(columns={"group": "column"}), title, task), notes)


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
