"""Metric names, built in one place: ``<task>[/<group>]/<metric>[/<suffix>]``.

``inference/f1``, ``inference/changing/recall``, ``generation/score/ci_low``, ``inference/count/failed``.
MLflow runs, metrics.json, reports and plots all use these names.
"""

from __future__ import annotations


def metric_key(task: str, group: str, metric: str, suffix: str | None = None) -> str:
    """``group`` is ``all`` (left out of the name) or an instance type."""
    parts = [task] + ([] if group == "all" else [group]) + [metric] + ([suffix] if suffix else [])
    return "/".join(parts)
