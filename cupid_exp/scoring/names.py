"""Metric names, built in one place: ``<task>[/<group>]/<metric>[/<suffix>]`` (``inference/changing/recall``)."""

from __future__ import annotations


def metric_key(task: str, group: str, metric: str, suffix: str | None = None) -> str:
    """``group`` is ``all`` (left out of the name) or an instance type."""
    parts = [task] + ([] if group == "all" else [group]) + [metric] + ([suffix] if suffix else [])
    return "/".join(parts)
