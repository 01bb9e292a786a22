"""A job's identity is by content (``cupid_exp.identity``): what decides its results, not how fast, through
which spelling of an endpoint or with which key it gets them; evaluation and synthesis alike."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.jobs import stub_config

from cupid_exp.evaluation import load_evaluation
from cupid_exp.identity import content, job_identity
from cupid_exp.job import specify

URL = "http://127.0.0.1:9/v1"
TOKEN = "+model.params.extra_headers={Authorization: 'Bearer sk-first-token-5678'}"


@pytest.mark.parametrize("changed", [
    ["model.max_concurrency=3", "evaluator.judge.max_concurrency=2"],
    ["model.pool.rpm=300", "model.pool.tpm=40000"],
    ["model.api_base=http://localhost:9/v1/"],
    ["model.params.extra_headers={Authorization: 'Bearer sk-rotated-token-1234'}"],
    ["calls.timeout=30", "calls.num_retries=7", "calls.cache=false", "calls.rate_limit_patience_s=60"],
    ["model.model_info.input_cost_per_token=1e-06", "model.model_info.output_cost_per_token=2e-06"],
], ids=["concurrency", "pacing", "endpoint spelling", "rotated header", "runtime how-to", "prices"])
def test_an_evaluation_job_keeps_its_identity_when_only_the_way_to_its_endpoint_changes(tmp_path: Path,
                                                                                       changed: list[str]) -> None:
    """The same job (journal, lock, MLflow run): a resume finds what it finished, whatever the throughput or a
    rotated token; a header's name still counts, a decoding parameter too."""
    def identity(*overrides: str) -> str:
        return specify(stub_config(URL, tmp_path, TOKEN, *overrides), tmp_path / "job", None, None,
                       load_evaluation).identity

    first = identity()
    assert identity(*changed) == first
    assert identity("model.params.temperature=0.5") != first
    assert identity("+model.params.extra_headers.X-Feature=beta") != first  # another header: another request


def test_secrets_enter_by_name_and_models_by_content() -> None:
    model = {"name": "m", "litellm_model": "openai/x", "api_base": "HTTP://LocalHost:80/v1/", "max_concurrency": 8,
             "rpm": 300, "tpm": None, "api_key_env": "KEY", "params": {"temperature": 0, "api_key": "sk-123456789",
                                                                     "extra_headers": {"X-Key": "secret-987654321"}},
             "local": {"gguf": "a.gguf", "n_ctx": 8192, "n_threads": 4, "prompt_cache_mb": 10, "flash_attn": False}}
    got = content({"model": model, "runtime": {"reask": 1, "timeout": 5}, "paths": {"output_root": "x"}})
    assert got == {"model": {"name": "m", "litellm_model": "openai/x", "api_base": "http://127.0.0.1/v1",
                             "params": {"temperature": 0, "api_key": "***",
                                                     "extra_headers": {"X-Key": "***"}},
                             "local": {"gguf": "a.gguf", "n_ctx": 8192}},
                   "runtime": {"reask": 1}}
    resolved = {"synthesis": {"n_personas": 2, "roles": {"writer": model}}}
    topped_up = {"synthesis": {"n_personas": 40, "roles": {"writer": {**model, "max_concurrency": 64}}}}
    ids = [job_identity(r, prompts_digest="p", not_identity=("synthesis.n_personas",)) for r in (resolved, topped_up)]
    assert ids[0] == ids[1]


@pytest.mark.parametrize("overrides", [[], ["calls.dry_run=true", "runtime.epochs=2", "calls.timeout=5"]])
def test_an_identity_is_the_same_since_the_call_settings_left_runtime(tmp_path: Path, overrides: list[str]) -> None:
    """``calls`` was part of ``runtime`` until 2026-11-29: the same job, written either way, keeps its identity (its
    journal, lock, folder and MLflow run), so that an earlier job resumes where it is."""
    from omegaconf import OmegaConf

    now = OmegaConf.to_container(stub_config(URL, tmp_path, *overrides), resolve=True)
    before = {k: v for k, v in now.items() if k != "calls"}
    before["runtime"] = {**now["runtime"], **now["calls"]}  # the one group of before
    assert set(now["calls"]) and content(now) == content(before)
    assert content(now)["runtime"]["dry_run"] == ("calls.dry_run=true" in overrides)
