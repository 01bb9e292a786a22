"""What a finished job's run is named by: its results at a glance."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cupid_exp.job.publish import results_line


@pytest.mark.parametrize("noun", ["instance", "persona"])
def test_the_headline_counts_only_the_units_with_a_result_whatever_the_kind(noun: str) -> None:
    """Synthesis tags its failed personas as evaluation tags its failed instances: neither counts as done."""
    job = SimpleNamespace(work=SimpleNamespace(units=[1, 2, 3], noun=noun))
    line = results_line(job, SimpleNamespace(n_units=3), {"cost/usd": 0.5},  # type: ignore[arg-type]
                        {f"cupid.failed_{noun}s": "1"})
    assert line.endswith(f"2 of 3 {noun}s"), line
