"""A whole report: every leaderboard and by-setting table of a selection, and the paper's tables left over."""

from __future__ import annotations

from typing import Any, Mapping

from cupid_exp.reporting.leaderboard import leaderboard
from cupid_exp.reporting.reference import matcher_of
from cupid_exp.reporting.selection import Selection
from cupid_exp.reporting.settings_table import setting_table
from cupid_exp.reporting.tables import Table, unfinished_table
from cupid_exp.reporting.tidy import tidy_frame
from cupid_exp.scoring.bootstrap import DEFAULT_N_BOOT
from cupid_exp.scoring.statistics import TASK_METRICS


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
