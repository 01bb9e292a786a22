"""The paper's published numbers (``paper_reference.yaml``), as rows of the report's tidy frame."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import pandas as pd
import yaml

from cupid_exp.data.schema import INSTANCE_TYPES
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
