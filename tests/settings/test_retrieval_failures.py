"""A retriever's provider failure fails that instance, counted, like any model call; the job goes on."""

from __future__ import annotations

import asyncio

import pytest

from cupid_exp.config import CallsConfig, DataConfig
from cupid_exp.data.loading import load_instances
from cupid_exp.llm.client import configure_litellm
from cupid_exp.llm.steps import StepFailed, Transcript
from cupid_exp.settings import make_setting
from cupid_exp.settings.retrieval import RetrievalConfig
from cupid_exp.testing.fault_server import ScriptedServer

INSTANCE = load_instances(DataConfig(name="sample", source="sample")).instances[0]


def embedding_body(n: int) -> dict:
    data = [{"object": "embedding", "index": i, "embedding": [1.0, float(i)]} for i in range(n)]
    return {"object": "list", "model": "e", "data": data, "usage": {"prompt_tokens": 3, "total_tokens": 3}}


@pytest.mark.parametrize("status,body,kind", [
    (500, {"error": {"message": "embedding backend down"}}, "provider"),
    (200, {"object": "list", "data": None}, "provider"),  # a malformed reply, not a crash
    (200, {"object": "list", "data": [{"index": 0}]}, "provider"),
    (429, {"error": {"message": "slow down"}}, "rate_limit"),
])
def test_an_embedding_provider_failure_is_a_step_failure(tmp_path, status, body, kind) -> None:
    configure_litellm(CallsConfig(cache_dir=str(tmp_path / "c"), cache=False, num_retries=0))
    with ScriptedServer([(status, body, {"retry-after": "0"})]) as server:
        setting = make_setting(RetrievalConfig(retriever="embedding", embedding_model="openai/embedder",
                                               embedding_api_base=server.url))
        with pytest.raises(StepFailed) as err:
            asyncio.run(setting.view(INSTANCE, None, Transcript()))
    assert (err.value.step, err.value.kind) == ("retrieve", kind)


def test_an_embedding_provider_that_answers_is_used(tmp_path) -> None:
    configure_litellm(CallsConfig(cache_dir=str(tmp_path / "c"), cache=False, num_retries=0))
    with ScriptedServer([(200, embedding_body(9), {})]) as server:
        setting = make_setting(RetrievalConfig(retriever="embedding", embedding_model="openai/embedder",
                                               embedding_api_base=server.url, top_k=2))
        view = asyncio.run(setting.view(INSTANCE, None, Transcript()))
    assert len(view.positions) == 2 and view.output.retrieved_positions == view.positions
