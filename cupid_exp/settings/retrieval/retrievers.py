"""Retrievers picking the top-k prior sessions: bm25 (default), embedding (local or litellm), recency."""

from __future__ import annotations

import importlib
import logging
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from cupid_exp.data.schema import Instance

if TYPE_CHECKING:  # numpy is imported by the retrievers that run, not with the settings registry
    import numpy as np
    from sentence_transformers import SentenceTransformer

RETRIEVERS = ("bm25", "embedding", "recency")
_TOKEN = re.compile(r"\w+")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def bm25_scores(query: str, docs: Sequence[str]) -> np.ndarray:
    from rank_bm25 import BM25Okapi

    return BM25Okapi([_tokens(d) or ["<empty>"] for d in docs]).get_scores(_tokens(query))  # an ndarray already


_ENCODERS: dict[str, SentenceTransformer] = {}  # package -> its loaded model, for the life of the process
_ENCODERS_LOCK = threading.Lock()


def local_encoder(package: str) -> SentenceTransformer:
    """A sentence-transformers model shipped in a PyPI package, loaded once per process under a lock."""
    with _ENCODERS_LOCK:
        if package not in _ENCODERS:
            _ENCODERS[package] = _load_quietly(package)
        return _ENCODERS[package]


def _load_quietly(package: str) -> SentenceTransformer:
    """Load without the libraries' progress bars and INFO lines; their warnings and errors still show."""
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as transformers_logging

    module = importlib.import_module(package)
    path = module.get_model_path() if hasattr(module, "get_model_path") else Path(module.__file__).parent / "model"
    logging.getLogger("sentence_transformers").setLevel(logging.WARNING)  # "Loading SentenceTransformer model..."
    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()  # "Loading weights" (transformers' own tqdm)
    try:
        return SentenceTransformer(str(path), device="cpu")
    finally:
        if bars:
            transformers_logging.enable_progress_bar()


def embed(texts: Sequence[str], model: str, api_base: str | None = None) -> np.ndarray:
    """Unit-length embeddings. An API model's errors are litellm's (the caller counts them per instance)."""
    import numpy as np

    if model.startswith("local:"):
        encoder = local_encoder(model.removeprefix("local:"))
        return np.asarray(encoder.encode(list(texts), normalize_embeddings=True, show_progress_bar=False))
    import litellm

    extra = {"api_base": api_base, "api_key": "EMPTY"} if api_base else {}
    response = litellm.embedding(model=model, input=list(texts), caching=litellm.cache is not None, **extra)
    data = getattr(response, "data", None)
    if not isinstance(data, list) or len(data) != len(texts) or not all(
            isinstance(item, dict) and isinstance(item.get("embedding"), list) for item in data):
        raise litellm.exceptions.APIError(status_code=502, message=f"malformed embedding reply: {str(response)[:200]}",
                                          llm_provider="embedding", model=model)
    vectors = np.asarray([item["embedding"] for item in data], dtype=float)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def top_k(instance: Instance, retriever: str, k: int, embedding_model: str, api_base: str | None = None
          ) -> list[int]:
    """1-based positions of the top-k sessions, in their original order; ties go to the more recent one."""
    import numpy as np

    docs = ["\n".join(m.content for m in s.dialogue) for s in instance.prior_interactions]
    n = len(docs)
    if retriever == "recency":
        scores = np.arange(n, dtype=float)
    elif retriever == "bm25":
        scores = bm25_scores(instance.current_request, docs)
    else:
        vectors = embed([instance.current_request, *docs], embedding_model, api_base)
        scores = vectors[1:] @ vectors[0]
    order = sorted(range(n), key=lambda i: (-float(scores[i]), -i))
    return sorted(i + 1 for i in order[:k])
