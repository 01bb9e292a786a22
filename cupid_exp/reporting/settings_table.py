"""The headline metric by model × setting × instance type, with the share of the oracle gain each setting recovers."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from cupid_exp.reporting.reference import GROUPS
from cupid_exp.reporting.runs import JobRun
from cupid_exp.reporting.tables import (
    Table,
    long_rows,
    n_cell,
    natural,
    notes_of,
    ordered,
    row_of,
    run_numbers,
    runs_by_model,
    setting_order,
    with_text,
)
from cupid_exp.scoring.statistics import HEADLINE

RECOVERED = "oracle gain recovered"
RECOVERED_COLUMNS = [RECOVERED, *(f"recovered: {g}" for g in GROUPS[1:])]
UNITS = {"inference": "F1 in %", "generation": "mean judge score 1–10"}


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
             f"({UNITS[task]}; [95% CI])")
    models = sorted(by_model, key=natural)
    index = pd.MultiIndex.from_tuples([(m, label) for m in models
                                       for label in sorted(by_model[m], key=setting_order)], names=["model", "setting"])
    run_of = {key: by_model[key[0]][key[1]] for key in index}
    rows = row_of(by_model)
    numbers = with_text(run_numbers(tidy, task, data, evaluator), task)
    numbers = numbers[(numbers["metric"] == metric) & numbers["run_id"].isin(list(rows))]
    numbers = numbers.assign(model=numbers["run_id"].map(rows))  # the row label: a model, and how it ran
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
                 f"and instance type, on this table's data only; blank without both a standard and an oracle run or "
                 f"when "
                 f"their gap is 0; "
                 f"no interval")
    return Table(title, frame.reset_index(), long_rows(long.rename(columns={"group": "column"}), title, task), notes)
