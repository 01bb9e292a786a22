"""Paper-layout leaderboards: a row per model, a column per type or setting variant, pivoted from the tidy frame."""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from cupid_exp.reporting.reference import GROUPS, matcher_of
from cupid_exp.reporting.runs import JobRun
from cupid_exp.reporting.tables import (
    PAPER_COLUMNS,
    Table,
    extra_settings,
    long_rows,
    model_of,
    n_cell,
    natural,
    notes_of,
    ordered,
    row_of,
    run_numbers,
    runs_by_model,
    with_text,
)
from cupid_exp.scoring.statistics import TASK_METRICS

UNITS = {"inference": "P / R / F1 in %", "generation": "mean judge score 1–10"}


def _paper_numbers(tidy: pd.DataFrame, task: str, evaluator: str) -> pd.DataFrame:
    """The paper's numbers for ``task`` scored with the matcher ``evaluator`` stands for (any, for generation)."""
    paper = tidy[(tidy["source"] == "paper") & (tidy["task"] == task)]
    return paper[paper["matcher"].isna() | (paper["matcher"] == matcher_of(evaluator))]


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
    for i, row in enumerate(models):
        order.append(row)
        model = model_of(row)
        last_of_model = i + 1 == len(models) or model_of(models[i + 1]) != model
        if model in paper_label and last_of_model:
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
    rows = row_of(by_model)
    runs_part = run_numbers(tidy, task, data, evaluator)
    runs_part = runs_part[runs_part["run_id"].isin(list(rows))]
    runs_part = runs_part.assign(model=runs_part["run_id"].map(rows))  # the row label: a model, and how it ran
    paper = _paper_numbers(tidy, task, evaluator).merge(source, on=["setting", "group"])
    if not by_model and paper.empty:
        return None
    ref_title = _reference_title(paper, summary_by_type)
    numbers = pd.concat([runs_part.merge(source, on=["setting", "group"]).assign(row=lambda f: f["model"]),
                         paper.assign(row="paper: " + paper["model"], reference=ref_title)], ignore_index=True)
    numbers = with_text(numbers, task)
    metrics = TASK_METRICS[task]
    order = _row_order(sorted(by_model, key=natural), paper)
    what = "with summaries, by instance type" if summary_by_type else "by model"
    title = (f"Paper reference ({ref_title}): {task} {what} ({UNITS[task]})" if data is None else
             f"{task.capitalize()} {what} — data={data}, evaluator={evaluator} ({UNITS[task]}; [95% CI])")
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
