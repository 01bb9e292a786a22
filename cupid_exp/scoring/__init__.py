"""Scoring: the statistics and the failure policy (defined once), a job's metrics, bootstrap intervals.

Names are loaded on first use, so that a task scoring one instance does not pull in pandas and numpy
(the summary does, later: ``cupid_exp.job``).
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "bootstrap": ("Comparison", "Estimate", "bootstrap_ci", "bootstrap_distribution", "ci_metrics", "paired_compare",
                  "point_estimate", "task_cis"),
    "metrics": ("error_counts", "flat_metrics", "task_metrics"),
    "names": ("metric_key",),
    "statistics": ("FAILURE_POLICIES", "HEADLINE", "TASK_METRICS", "harmonic_mean", "task_frame", "treatment"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
