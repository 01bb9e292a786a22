"""What every report table shares: its shape, the cell text of a number, the column order of settings; and the paper's
published numbers (``paper_reference.yaml``) as rows of the report's tidy frame."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd
import yaml

from cupid_exp.data.schema import INSTANCE_TYPES
from cupid_exp.reporting.runs import JobRun, row_labels
from cupid_exp.reporting.selection import ended
from cupid_exp.scoring.bootstrap import Estimate
from cupid_exp.scoring.statistics import TASK_METRICS

REFERENCE_FILE = Path(__file__).with_name("paper_reference.yaml")
GROUPS = ("all", *INSTANCE_TYPES)


def load_reference(path: Path = REFERENCE_FILE) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def matcher_of(evaluator: str) -> str:
    """Which paper matcher a run's evaluator corresponds to (Table 11 for PrefMatcher, else Table 1)."""
    return "prefmatcher" if evaluator == "prefmatcher" else "gpt4o"


def paper_rows(reference: Mapping[str, Any]) -> pd.DataFrame:
    """One row per published number on a run's coordinates (setting, group, metric); inference values as fractions."""
    models = reference.get("models", {})
    rows = []
    for table in reference["tables"].values():
        task = table["task"]
        for label, cells in table["rows"].items():
            for column, cell in zip(table["columns"], cells, strict=False):
                setting, group = (table["setting"], column) if column in GROUPS else (column, "all")
                values = cell if task == "inference" else [cell]
                for metric, value in zip(TASK_METRICS[task], values, strict=False):
                    rows.append({"source": "paper", "reference": table["title"].split(":")[0],
                                 "matcher": table.get("matcher"), "model": label, "conf_model": models.get(label),
                                 "setting": setting, "task": task, "group": group, "metric": metric,
                                 "value": value / 100 if task == "inference" else value})
    return pd.DataFrame(rows)
PAPER_SETTINGS = ("standard", "oracle", "oracle_preference", "summary")
# the paper's columns of each leaderboard: the instance groups (setting standard), then other settings' 'all'
PAPER_COLUMNS = {"inference": [*GROUPS, "oracle", "summary"],
                 "generation": [*GROUPS, "oracle", "oracle_preference", "summary"]}
SCALE = {"inference": (100.0, 1), "generation": (1.0, 2)}  # (factor, digits) of a cell
UNIT = {"inference": "%", "generation": "judge score 1-10"}  # what a cell's number is, as its table's title says
DERIVED_UNIT = "% of the oracle gain"  # a share the report derives (oracle gain recovered), printed as a percentage
# what a table's CSV rows carry, one per number, in the unit the table's title names
LONG_COLUMNS = ["table", "data", "model", "source", "reference", "column", "setting", "metric", "value", "ci_low",
                "ci_high", "unit", "n", "run_id"]


@dataclass
class Table:
    """A printed table: its text cells, the numbers behind them (a row each, for CSV) and its notes."""

    title: str
    frame: pd.DataFrame
    long: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def with_text(frame: pd.DataFrame, task: str) -> pd.DataFrame:
    """Each number's cell: '43.0 [39.8–46.1]' (inference, in %), '6.46 [6.10–6.80]' (judge score), '–' for none."""
    factor, digits = SCALE[task]

    def text(*numbers: float) -> str:  # value, low, high; a missing one (None, NaN, NA) as NaN: '–' for no value
        value, low, high = (math.nan if pd.isna(x) else float(x) for x in numbers)
        return Estimate("", value, low, high, 0, 0).fmt(factor, digits)

    cells = [text(*row) for row in zip(frame["value"], frame["ci_low"], frame["ci_high"], strict=True)]
    return frame.assign(text=pd.Series(cells, index=frame.index, dtype=object))


def run_numbers(tidy: pd.DataFrame, task: str, by_model: Mapping[str, Mapping[str, JobRun]]) -> pd.DataFrame:
    """The tidy frame's numbers of ``task`` from the runs of ``by_model`` (``runs_by_model``: one data set ×
    evaluator), each with its row's label as ``model``: a model, and how it ran."""
    rows = {run.run_id: row for row, settings in by_model.items() for run in settings.values()}
    numbers = tidy[(tidy["source"] == "run") & (tidy["task"] == task) & tidy["run_id"].isin(list(rows))]
    return numbers.assign(model=numbers["run_id"].map(rows))


def notes_of(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["note"].dropna()))


def ordered(frame: pd.DataFrame, orders: Mapping[str, Sequence[Any]]) -> pd.DataFrame:
    ranks = {name: {v: i for i, v in enumerate(values)} for name, values in orders.items()}
    return frame.sort_values(list(orders), key=lambda col: col.map(ranks[col.name]), kind="stable")


def long_rows(frame: pd.DataFrame, title: str, task: str) -> pd.DataFrame:
    """A table's numbers as CSV rows (``LONG_COLUMNS``), scaled as its cells are."""
    derived = frame["source"].eq("derived")
    factor = derived.map({True: 100.0, False: SCALE[task][0]})
    scaled = {col: pd.to_numeric(frame[col], errors="coerce") * factor for col in ("value", "ci_low", "ci_high")
              if col in frame}
    unit = derived.map({True: DERIVED_UNIT, False: UNIT[task]})
    return frame.assign(table=title, unit=unit, **scaled).reindex(columns=LONG_COLUMNS)


def n_cell(scored: int, total: float | None) -> str:
    """'85/90' when some instances were not scored, else '90'."""
    return f"{scored}/{int(total)}" if total is not None and total != scored else str(scored)


def natural(label: str) -> list[Any]:
    """Sort key that puts k=2 before k=10."""
    return [int(x) if i % 2 else x for i, x in enumerate(re.split(r"(\d+)", label))]


def extra_settings(labels: Iterable[str]) -> list[str]:
    return sorted({lb for lb in labels if lb not in PAPER_SETTINGS}, key=natural)


def setting_order(label: str) -> tuple[int, list[Any]]:
    """standard, then the settings beyond the paper's (natural order), then oracle, oracle_preference, summary."""
    if label in PAPER_SETTINGS:
        return (0 if label == "standard" else 1 + PAPER_SETTINGS.index(label), [])
    return (1, natural(label))


def runs_by_model(task: str, runs: Sequence[JobRun], data: str | None, evaluator: str) -> dict[str, dict[str, JobRun]]:
    """{row: {setting label: run}} for one task × data × evaluator; rows labelled by ``runs.row_labels``."""
    here = [run for run in runs if task in run.tasks and run.data_label == data and run.evaluator == evaluator]
    labels = row_labels(here)
    by_model: dict[str, dict[str, JobRun]] = {}
    for run in here:
        by_model.setdefault(labels[run.run_id], {})[run.setting_label] = run
    return by_model


def model_of(row: str) -> str:
    """The model a row label names ('gpt4o' of 'gpt4o · temperature=0.4')."""
    return row.split(" · ")[0]


UNFINISHED_TITLE = "Runs that did not finish (in no table above)"


def unfinished_table(runs: Sequence[JobRun]) -> Table:
    """The failed, killed and running runs, with their data and why they ended."""
    rows = [{"run_id": r.short, "model": r.model, "setting": r.setting_label, "data": r.data_label,
             "evaluator": r.evaluator, "status": r.status, "reason": ended(r) or "–"} for r in runs]
    frame = pd.DataFrame(rows)
    return Table(UNFINISHED_TITLE, frame, frame.assign(table=UNFINISHED_TITLE, source="unfinished"))
