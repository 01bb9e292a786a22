"""Cluster bootstrap and paired comparison, checked against cases small enough to enumerate by hand."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from cupid_exp.scoring.bootstrap import (
    bootstrap_ci,
    bootstrap_distribution,
    ci_metrics,
    paired_compare,
    point_estimate,
    task_cis,
)


def rec(persona: str, itype: str, **values) -> dict:
    return {"key": f"{persona}/{itype}", "persona_id": persona, "instance_type": itype, "errors": [], **values}


# Persona A: two instances (P 1.0, 0.0; R 1.0, 0.5); persona B: one instance (P 1.0, R 0.0).
# Resampling 2 personas with replacement: {A,A} p=1/4, {A,B} p=1/2, {B,B} p=1/4.
#   mean P: AA (1+0+1+0)/4 = 0.5   AB (1+0+1)/3 = 2/3   BB 1.0
#   mean R: AA 0.75                AB (1+.5+0)/3 = 0.5  BB 0.0
#   F1 = HM(mean P, mean R): AA 0.6   AB 4/7   BB 0.0
TWO_PERSONAS = [rec("A", "consistent", precision=1.0, recall=1.0),
                rec("A", "contrastive", precision=0.0, recall=0.5),
                rec("B", "consistent", precision=1.0, recall=0.0)]


def test_point_estimates_are_the_papers_macro_numbers() -> None:
    assert point_estimate(TWO_PERSONAS, "precision") == pytest.approx(2 / 3)
    assert point_estimate(TWO_PERSONAS, "recall") == pytest.approx(0.5)
    # HM of the means, not the mean of per-instance F1s (which would be (1 + 0 + 0) / 3)
    assert point_estimate(TWO_PERSONAS, "f1") == pytest.approx(4 / 7)


@pytest.mark.parametrize("metric, outcomes", [
    ("precision", {0.5: 0.25, 2 / 3: 0.5, 1.0: 0.25}),
    ("recall", {0.75: 0.25, 0.5: 0.5, 0.0: 0.25}),
    ("f1", {0.6: 0.25, 4 / 7: 0.5, 0.0: 0.25}),
])
def test_bootstrap_draws_whole_personas_with_the_enumerated_frequencies(metric, outcomes) -> None:
    samples = bootstrap_distribution(TWO_PERSONAS, metric, n_boot=8000, seed=1)
    rounded = Counter(round(float(s), 9) for s in samples)
    assert set(rounded) == {round(v, 9) for v in outcomes}  # only the three cluster resamples occur
    for value, prob in outcomes.items():
        assert rounded[round(value, 9)] / len(samples) == pytest.approx(prob, abs=0.03)


def test_interval_is_the_percentile_interval_of_the_enumerated_distribution() -> None:
    est = bootstrap_ci(TWO_PERSONAS, "f1", n_boot=4000, seed=0)
    assert est.value == pytest.approx(4 / 7)
    assert (est.low, est.high) == (pytest.approx(0.0), pytest.approx(0.6))
    assert (est.n, est.n_clusters) == (3, 2)
    p = bootstrap_ci(TWO_PERSONAS, "precision", n_boot=4000, seed=0)
    # an instance-level bootstrap could draw A's P=0 instance three times (mean 0); clusters never go below 0.5
    assert (p.low, p.high) == (pytest.approx(0.5), pytest.approx(1.0))


def test_seeded_and_reproducible() -> None:
    rng = np.random.default_rng(7)
    records = [rec(f"p{i}", t, precision=float(rng.random()), recall=float(rng.random()))
               for i in range(30) for t in ("consistent", "contrastive", "changing")]
    a = bootstrap_ci(records, "f1", seed=3)
    b = bootstrap_ci(records, "f1", seed=3)
    c = bootstrap_ci(records, "f1", seed=4)
    assert (a.low, a.high) == (b.low, b.high)
    assert (a.low, a.high) != (c.low, c.high)
    assert a.low < a.value < a.high


def test_resample_weights_count_each_draw_of_the_generator() -> None:
    """Row b counts how often each persona was drawn in resample b (the generator's draws, in order): the same
    resamples as before they were counted with one bincount, so every interval is unchanged. The seeded weights a
    job's table and plots share are those, read-only."""
    from cupid_exp.scoring.bootstrap import _epoch_weights, _seeded_weights

    n_clusters, n_boot = 7, 50
    draws = np.random.default_rng(5).integers(0, n_clusters, size=(n_boot, n_clusters))
    expected = np.array([[Counter(row.tolist())[i] for i in range(n_clusters)] for row in draws], dtype=float)
    weights = _epoch_weights(n_clusters, 1, n_boot, np.random.default_rng(5))
    assert np.array_equal(weights, expected) and (weights.sum(axis=1) == n_clusters).all()
    shared = _seeded_weights(n_clusters, n_boot, 5)
    assert np.array_equal(shared, expected) and _seeded_weights(n_clusters, n_boot, 5) is shared
    with pytest.raises(ValueError):
        shared[0, 0] = 99.0


def test_epoch_weights_are_one_call_s_draws_counted_a_resample_at_a_time() -> None:
    """Built row by row (each resample's epochs drawn in turn), the weights are those of every persona, then every
    epoch, drawn in one call each and counted with one bincount: every interval with epochs is unchanged."""
    from cupid_exp.scoring.bootstrap import _epoch_weights

    for n_clusters, n_epochs, seed in ((7, 1, 5), (5, 3, 0), (3, 7, 11), (40, 2, 3)):
        rng, n_boot, width = np.random.default_rng(seed), 60, n_clusters * n_epochs
        personas = rng.integers(0, n_clusters, size=(n_boot, n_clusters))
        epochs = rng.integers(0, n_epochs, size=(n_boot, n_clusters, n_epochs))
        cells = (np.arange(n_boot)[:, None, None] * width + personas[:, :, None] * n_epochs + epochs).ravel()
        expected = np.bincount(cells, minlength=n_boot * width).reshape(n_boot, width).astype(float)
        assert np.array_equal(_epoch_weights(n_clusters, n_epochs, n_boot, np.random.default_rng(seed)), expected)


def test_a_job_s_intervals_leave_no_resample_weights_held() -> None:
    """The weights its intervals shared are let go once they are computed (the job's process lives on to publish)."""
    from cupid_exp.scoring.bootstrap import _seeded_weights, ci_metrics

    records = [rec(f"p{i}", t, precision=0.5, recall=1.0) for i in range(5) for t in ("consistent", "changing")]
    assert ci_metrics(records, ["inference"], n_boot=50)
    assert _seeded_weights.cache_info().currsize == 0


def test_cluster_interval_is_wider_than_an_instance_interval_when_personas_are_correlated() -> None:
    rng = np.random.default_rng(0)
    records = []
    for i in range(40):
        v = float(rng.random())  # the same score for all three instances of a persona
        records += [rec(f"p{i}", t, judge_score=1 + 9 * v) for t in ("consistent", "contrastive", "changing")]
    clustered = bootstrap_ci(records, "score", seed=0)
    independent = bootstrap_ci(records, "score", seed=0, cluster="key")
    assert clustered.value == pytest.approx(independent.value)
    ratio = (clustered.high - clustered.low) / (independent.high - independent.low)
    assert 1.4 < ratio < 2.1  # ~sqrt(3): three copies carry one persona's worth of information


def test_failed_instances_are_excluded_or_zeroed() -> None:
    records = TWO_PERSONAS + [rec("C", "consistent", precision=None, recall=None,
                                  errors=[{"step": "infer", "kind": "unparseable", "message": "x"}])]
    assert bootstrap_ci(records, "precision").n == 3
    assert bootstrap_ci(records, "precision").n_clusters == 2  # C has nothing scored
    zero = bootstrap_ci(records, "precision", failure_policy="zero")
    assert zero.n == 4 and zero.value == pytest.approx(2 / 4)
    with pytest.raises(ValueError):
        bootstrap_ci(records, "precision", failure_policy="drop")
    empty = bootstrap_ci([], "f1")
    assert empty.n == 0 and math.isnan(empty.value) and empty.fmt() == "–"


def test_task_cis_and_flat_metric_names() -> None:
    cis = task_cis(TWO_PERSONAS, "inference", n_boot=200)
    assert set(cis) == {"all", "consistent", "contrastive"}
    assert cis["consistent"]["precision"].value == pytest.approx(1.0)
    assert cis["contrastive"]["recall"].value == pytest.approx(0.5)
    flat = ci_metrics(TWO_PERSONAS, ["inference"], n_boot=200)
    assert flat["inference/f1/ci_high"] == pytest.approx(0.6)
    assert "inference/consistent/precision/ci_low" in flat and "inference/changing/f1/ci_low" not in flat
    gen = ci_metrics([rec("A", "changing", judge_score=7), rec("B", "changing", judge_score=9)], ["generation"],
                     n_boot=500)
    assert gen["generation/score/ci_low"] == pytest.approx(7) and gen["generation/changing/score/ci_high"] == 9


def test_fmt_scales_and_rounds() -> None:
    est = bootstrap_ci(TWO_PERSONAS, "f1", n_boot=4000)
    assert est.fmt(scale=100) == "57.1 [0.0–60.0]"


# Paired case, three personas. Per-instance differences B - A (precision):
#   X: two instances, +0.4 and +0.4 (sum +0.8)   Y: one, +0.1   Z: one, -0.3        mean diff 0.6/4 = 0.15
# Sign flips of (X, Y, Z) sums over 4 instances: (±0.8 ±0.1 ∓0.3)/4 ∈ {±0.15, ±0.3, ±0.1, ±0.25};
# |d*| >= 0.15 for 6 of the 8 patterns -> p = 0.75 exactly.
# Bootstrap: XXX (p=1/27) gives +0.4, ZZZ (p=1/27) gives -0.3; 1/27 > 2.5% -> CI = [-0.3, 0.4].
# An inference instance is scored when it has both precision and recall (recall is fixed here; only precision
# is compared); V's precision=None is a failed instance.
def prec(persona: str, itype: str, precision: float | None) -> dict:
    return rec(persona, itype, precision=precision, recall=None if precision is None else 0.5)


RUN_A = [prec("X", "consistent", 0.2), prec("X", "changing", 0.4),
         prec("Y", "consistent", 0.5), prec("Z", "consistent", 0.6),
         prec("W", "consistent", 0.9),  # only in A
         prec("V", "consistent", 0.1)]  # failed in B
RUN_B = [prec("X", "consistent", 0.6), prec("X", "changing", 0.8),
         prec("Y", "consistent", 0.6), prec("Z", "consistent", 0.3),
         prec("V", "consistent", None), prec("U", "consistent", 0.5)]  # U only in B


def test_paired_compare_matches_the_hand_computed_case() -> None:
    cmp = paired_compare(RUN_A, RUN_B, "precision", n_boot=4000, seed=0)
    assert cmp.n_shared == 4 and cmp.n_clusters == 3
    assert (cmp.only_a, cmp.only_b) == (2, 1)  # W, and V (failed in B); U
    assert cmp.a == pytest.approx(1.7 / 4) and cmp.b == pytest.approx(2.3 / 4)
    assert cmp.diff == pytest.approx(0.15)
    assert cmp.p_exact and cmp.p_value == pytest.approx(0.75)
    assert (cmp.low, cmp.high) == (pytest.approx(-0.3), pytest.approx(0.4))


def test_paired_compare_detects_a_consistent_difference_and_is_antisymmetric() -> None:
    rng = np.random.default_rng(1)
    a, b = [], []
    for i in range(20):
        for t in ("consistent", "contrastive", "changing"):
            base = float(rng.uniform(2, 8))
            a.append(rec(f"p{i}", t, judge_score=base))
            b.append(rec(f"p{i}", t, judge_score=base + 1 + float(rng.normal(0, 0.3))))
    fwd = paired_compare(a, b, "score", seed=0)
    back = paired_compare(b, a, "score", seed=0)
    assert fwd.diff > 0.8 and 0 < fwd.low < fwd.diff < fwd.high
    assert not fwd.p_exact and fwd.p_value == pytest.approx(1 / (1 + 10000))  # no random pattern is as extreme
    assert back.diff == pytest.approx(-fwd.diff) and back.p_value == pytest.approx(fwd.p_value)


def test_paired_f1_uses_the_harmonic_mean_of_means() -> None:
    a = [rec("X", "consistent", precision=0.5, recall=0.5), rec("Y", "consistent", precision=0.5, recall=0.5)]
    b = [rec("X", "consistent", precision=1.0, recall=0.0), rec("Y", "consistent", precision=1.0, recall=1.0)]
    cmp = paired_compare(a, b, "f1", n_boot=100)
    assert cmp.b == pytest.approx(2 * 1.0 * 0.5 / 1.5) and cmp.a == pytest.approx(0.5)
    # 4 patterns, B-A: none 2/3-1/2 = +1/6; swap X: HM(.75,.75) - HM(.75,.25) = .75-.375 = +.375;
    # swap Y: -.375; swap both: -1/6. All four are at least as extreme as 1/6 -> p = 1.
    assert cmp.diff == pytest.approx(1 / 6)
    assert cmp.p_exact and cmp.p_value == pytest.approx(1.0)
    assert paired_compare(a, b, "precision", n_boot=100).p_value == pytest.approx(0.5)  # ±.5 ±0 / 2


def test_paired_compare_with_nothing_shared() -> None:
    cmp = paired_compare([prec("X", "consistent", 1.0)], [prec("Y", "consistent", 1.0)], "precision")
    assert cmp.n_shared == 0 and math.isnan(cmp.diff)
