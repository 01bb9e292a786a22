"""An endpoint in one spelling (``llm.endpoints``), and a response cache that keeps its answers across a rotated
key but never shares them between endpoints or models."""

from __future__ import annotations

import pytest

from cupid_exp.config import CallsConfig, ModelConfig, PoolConfig
from cupid_exp.llm.client import LLMClient
from cupid_exp.llm.endpoints import canonical_api_base
from cupid_exp.llm.usage import UsageMeter


@pytest.mark.parametrize("spelt,canonical", [
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ("http://localhost:8000/v1/", "http://127.0.0.1:8000/v1"),
    ("HTTP://LOCALHOST:8000/v1//", "http://127.0.0.1:8000/v1"),
    ("https://api.example.com:443/v1", "https://api.example.com/v1"),
    ("http://[::1]:8000/v1", "http://127.0.0.1:8000/v1"),
    ("https://api.example.com/V1", "https://api.example.com/V1"),  # a path is the server's: case kept
    (None, None),
])
def test_an_endpoint_has_one_spelling(spelt: str | None, canonical: str | None) -> None:
    assert canonical_api_base(spelt) == canonical


def _namespace(tmp_path, **model) -> str:
    runtime = CallsConfig(cache_dir=str(tmp_path / "cache"))
    config = ModelConfig(name="m", litellm_model=model.pop("litellm_model", "openai/x"), **model)
    return LLMClient(config, runtime, UsageMeter()).cache_namespace(None)


def test_the_cache_keeps_its_answers_across_a_rotated_key_and_spelling_but_not_across_endpoints(tmp_path) -> None:
    base = {"api_base": "http://127.0.0.1:1/v1", "params": {"temperature": 0, "api_key": "sk-first-12345678",
                                                            "extra_headers": {"Authorization": "Bearer tok-11111111"}}}
    first = _namespace(tmp_path, **base)
    rotated = {**base, "params": {"temperature": 0, "api_key": "sk-second-87654321",
                                  "extra_headers": {"Authorization": "Bearer tok-22222222"}}}
    assert _namespace(tmp_path, **rotated) == first
    assert _namespace(tmp_path, **{**base, "api_base": "http://localhost:1/v1/"}) == first
    assert _namespace(tmp_path, **{**base, "max_concurrency": 64, "pool": PoolConfig(rpm=100.0)}) == first
    assert _namespace(tmp_path, **{**base, "api_base": "http://127.0.0.1:2/v1"}) != first  # another endpoint
    assert _namespace(tmp_path, **{**base, "litellm_model": "openai/y"}) != first  # another model
    other_header = {**base, "params": {**base["params"], "extra_headers": {"Authorization": "x", "X-Beta": "1"}}}
    assert _namespace(tmp_path, **other_header) != first  # a header that may change the answer
