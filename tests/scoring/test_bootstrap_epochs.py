"""With epochs the intervals resample epochs within personas (a two-stage cluster bootstrap), checked against the
bootstrap computed by hand on a small fixture: personas drawn with replacement, then each drawn persona's epochs."""

from __future__ import annotations

import numpy as np
import pytest

from cupid_exp.scoring.bootstrap import bootstrap_ci, paired_compare

PERSONAS = ("p1", "p2", "p3", "p4")
N_EPOCHS, N_BOOT, SEED = 3, 400, 11
# judge scores: persona -> one score per epoch (A), and B's
A = {"p1": (6, 2, 7), "p2": (3, 3, 9), "p3": (8, 5, 5), "p4": (1, 4, 2)}
B = {"p1": (7, 6, 9), "p2": (3, 8, 9), "p3": (9, 5, 7), "p4": (5, 4, 6)}


def _records(scores: dict[str, tuple[int, ...]]) -> list[dict]:
    return [{"key": f"{p}/consistent#{e}", "persona_id": p, "instance_type": "consistent", "epoch": e,
             "judge_score": float(s)} for p, by_epoch in scores.items() for e, s in enumerate(by_epoch)]


def _by_hand(rng: np.random.Generator, statistic) -> tuple[float, float]:
    """Draw 4 personas with replacement, then 3 epochs with replacement within each drawn persona; percentiles."""
    personas = rng.integers(0, len(PERSONAS), size=(N_BOOT, len(PERSONAS)))
    epochs = rng.integers(0, N_EPOCHS, size=(N_BOOT, len(PERSONAS), N_EPOCHS))
    values = []
    for b in range(N_BOOT):
        cells = [(PERSONAS[personas[b, i]], epochs[b, i, j]) for i in range(len(PERSONAS)) for j in range(N_EPOCHS)]
        values.append(statistic(cells))
    low, high = np.quantile(values, [0.025, 0.975])
    return float(low), float(high)


def _mean(scores, cells) -> float:
    return float(np.mean([scores[p][e] for p, e in cells]))


def test_the_paired_interval_resamples_epochs_within_personas() -> None:
    c = paired_compare(_records(A), _records(B), "score", n_boot=N_BOOT, seed=SEED, n_perm=16)
    low, high = _by_hand(np.random.default_rng(SEED), lambda cells: _mean(B, cells) - _mean(A, cells))
    assert c.n_shared == 12 and c.n_clusters == 4
    assert c.diff == pytest.approx(np.mean([s for v in B.values() for s in v]) - np.mean([s for v in A.values()
                                                                                           for s in v]))
    assert (c.low, c.high) == (pytest.approx(low), pytest.approx(high))
    # a persona-only bootstrap (epochs kept together) gives another interval: the epochs' draw is really there
    flat = [{**r, "epoch": None} for r in _records(A)], [{**r, "epoch": None} for r in _records(B)]
    plain = paired_compare(*flat, "score", n_boot=N_BOOT, seed=SEED, n_perm=16, key="key")
    assert (plain.low, plain.high) != (c.low, c.high)


def test_the_interval_of_one_run_resamples_epochs_within_personas() -> None:
    est = bootstrap_ci(_records(A), "score", n_boot=N_BOOT, seed=SEED)
    low, high = _by_hand(np.random.default_rng(SEED), lambda cells: _mean(A, cells))
    assert est.n == 12 and est.n_clusters == 4
    assert (est.low, est.high) == (pytest.approx(low), pytest.approx(high))
