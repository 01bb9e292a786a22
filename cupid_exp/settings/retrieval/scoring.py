"""Retrieval scored from CUPID's session labels: were the oracle sessions found, and was a contrastive or stale one
pulled in? Models fail mostly by attending to the wrong sessions (the paper)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

from cupid_exp.data.schema import Instance, normalize_text, relevant_positions


def stale_positions(instance: Instance) -> list[int]:
    """Sessions of the current factor with a different (superseded) preference: changing instances."""
    factor, oracle = normalize_text(instance.current_context_factor), relevant_positions(instance)
    return [i for i, s in enumerate(instance.prior_interactions, start=1)
            if normalize_text(s.context_factor) == factor and i not in oracle]


def contrastive_positions(instance: Instance) -> list[int]:
    """Sessions of the contrastive factor: in CUPID the only other factor that recurs in the history."""
    current = normalize_text(instance.current_context_factor)
    factors = [normalize_text(s.context_factor) for s in instance.prior_interactions]
    recurring = {f for f, n in Counter(factors).items() if n >= 2 and f != current}
    return [i for i, f in enumerate(factors, start=1) if f in recurring]


def score_retrieval(instance: Instance, retrieved: Sequence[int], oracle: Sequence[int]) -> dict[str, float | None]:
    hits = len(set(retrieved) & set(oracle))
    contrastive, stale = contrastive_positions(instance), stale_positions(instance)
    return {
        "recall_at_k": hits / len(oracle) if oracle else None,
        "precision_at_k": hits / len(retrieved) if retrieved else None,
        "contrastive_hit": float(bool(set(retrieved) & set(contrastive))) if contrastive else None,
        "stale_hit": float(bool(set(retrieved) & set(stale))) if stale else None,
    }


def retrieval_metrics(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """recall@k / precision@k of the oracle sessions, and how often a contrastive or stale one was retrieved."""
    rows = [{"instance_type": r["instance_type"], **r["retrieval"]} for r in records if r.get("retrieval")]
    if not rows:
        return {}
    import pandas as pd  # when a job is summarised, not with the settings registry

    df = pd.DataFrame(rows)
    found = df[["recall_at_k", "precision_at_k"]].astype(float)
    means = {"retrieval": found.mean(), **{f"retrieval/{itype}": part.mean()
                                           for itype, part in found.groupby(df["instance_type"])}}
    out = {f"{prefix}/{name}": float(v) for prefix, values in means.items() for name, v in values.items() if v == v}
    for name, metric in (("contrastive_hit", "contrastive_hit_rate"), ("stale_hit", "stale_hit_rate")):
        hits = df[name].astype(float).dropna()
        if len(hits):
            out[f"retrieval/{metric}"], out[f"retrieval/{metric}/n"] = float(hits.mean()), float(len(hits))
    return out
