"""Session retrieval for the retrieval setting, and its scoring from CUPID's session labels.

The paper finds that models fail mostly by attending to the wrong prior sessions; every
prior session carries its context factor and preference, so a retriever's choice can be
scored directly: did it find the oracle sessions, and did it pull in a contrastive
(same-looking factor, conflicting preference) or a stale (superseded) session?
"""

from __future__ import annotations

import functools
import importlib
import re
from collections import Counter
from typing import Sequence

import numpy as np

from cupid_exp.config import SettingConfig
from cupid_exp.data.schema import Instance, PriorSession, normalize_text

RETRIEVERS = ("bm25", "embedding", "recency")
_TOKEN = re.compile(r"\w+")


def session_text(session: PriorSession) -> str:
    return "\n".join(m.content for m in session.dialogue)


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def _bm25_scores(query: str, docs: Sequence[str]) -> np.ndarray:
    from rank_bm25 import BM25Okapi

    return np.asarray(BM25Okapi([_tokens(d) or ["<empty>"] for d in docs]).get_scores(_tokens(query)))


@functools.lru_cache(maxsize=2)
def _local_encoder(package: str):
    """A sentence-transformers model shipped inside a PyPI package (offline, no hub)."""
    from pathlib import Path

    from sentence_transformers import SentenceTransformer

    module = importlib.import_module(package)
    path = module.get_model_path() if hasattr(module, "get_model_path") else Path(module.__file__).parent / "model"
    return SentenceTransformer(str(path), device="cpu")


def _embed(texts: Sequence[str], model: str) -> np.ndarray:
    if model.startswith("local:"):
        return np.asarray(_local_encoder(model.removeprefix("local:")).encode(list(texts),
                                                                               normalize_embeddings=True))
    import litellm

    response = litellm.embedding(model=model, input=list(texts), caching=litellm.cache is not None)
    vectors = np.asarray([item["embedding"] for item in response.data], dtype=float)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _embedding_scores(query: str, docs: Sequence[str], model: str) -> np.ndarray:
    vectors = _embed([query, *docs], model)
    return vectors[1:] @ vectors[0]


def retrieve(instance: Instance, setting: SettingConfig) -> list[int]:
    """1-based positions of the top-k sessions for the current request, in their original order.

    Ties go to the more recent session, so results are deterministic.
    """
    docs = [session_text(s) for s in instance.prior_interactions]
    n = len(docs)
    if setting.retriever == "recency":
        scores = np.arange(n, dtype=float)
    elif setting.retriever == "bm25":
        scores = _bm25_scores(instance.current_request, docs)
    elif setting.retriever == "embedding":
        scores = _embedding_scores(instance.current_request, docs, setting.embedding_model)
    else:
        raise ValueError(f"setting.retriever={setting.retriever!r}; choose one of {list(RETRIEVERS)}")
    order = sorted(range(n), key=lambda i: (-float(scores[i]), -i))
    return sorted(i + 1 for i in order[: max(0, setting.top_k)])


def stale_positions(instance: Instance) -> list[int]:
    """Sessions of the current factor with a different (superseded) preference: changing instances."""
    factor = normalize_text(instance.current_context_factor)
    preference = normalize_text(instance.current_contextual_preference)
    return [i for i, s in enumerate(instance.prior_interactions, start=1)
            if normalize_text(s.context_factor) == factor and normalize_text(s.contextual_preference) != preference]


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
