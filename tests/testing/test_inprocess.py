"""The in-process model: the HTTP stub's replies and its non-wire faults, through our client and litellm as a custom
provider, counted as the stub counts them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cupid_exp.config import CallsConfig, ModelConfig
from cupid_exp.llm.client import LLMClient, ProviderError, configure_litellm
from cupid_exp.llm.pools import forget_pools
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.testing.inprocess import InProcessModel
from cupid_exp.testing.stub_config import StubConfig, stub_arguments
from cupid_exp.testing.stub_llm_server import StubServer

INFER = [{"role": "system", "content": "Infer the user's preference."},
         {"role": "user", "content": "Sessions...\n\n### Most Likely Preference\n\nWhich one?"}]


@pytest.fixture(autouse=True)
def _fresh_pools():
    forget_pools()  # a pool's failures and pace are the process's: each test starts from none
    yield
    forget_pools()


def ask(litellm_model: str, tmp_path: Path, api_base: str | None = None, messages=INFER, **runtime):
    rt = CallsConfig(cache_dir=str(tmp_path / "cache"), cache=False,
                       **{"num_retries": 2, "timeout": 10, **runtime})
    configure_litellm(rt)
    client = LLMClient(ModelConfig(name="stub", litellm_model=litellm_model, api_base=api_base,
                                   params={"max_tokens": 300}), rt, UsageMeter())
    return asyncio.run(client.complete(messages, step="infer"))


def test_it_answers_what_the_http_stub_answers_with_usage_and_counts(tmp_path: Path) -> None:
    with StubServer() as stub:
        wire = ask("openai/stub", tmp_path, stub.url)
    with InProcessModel() as model:
        here = ask(model.litellm_model, tmp_path)
        stats = model.stats()
    assert here.text == wire.text and "Most Likely Preference" in here.text  # one reply function, not a copy
    assert (here.prompt_tokens, here.completion_tokens) == (wire.prompt_tokens, wire.completion_tokens) != (0, 0)
    assert stats["received"] == stats["completed"] == {"infer": 1}
    assert stats["billed"]["requests"] == 1 and stats["tokens"]["prompt_tokens"] == here.prompt_tokens


@pytest.mark.parametrize("kind,counted", [("429", "rate_limited"), ("500", "retries"), ("503", "retries")])
def test_provider_errors_are_litellms_types_and_our_retries_take_them(tmp_path: Path, kind: str, counted: str) -> None:
    with InProcessModel(fail_first=1, fail_first_kind=kind, retry_after=0.2) as model:
        out = ask(model.litellm_model, tmp_path)
        stats = model.stats()
    assert stats["faults"] == {"infer": {kind: 1}} and stats["total_received"] == 2  # the fault happened
    assert out.text and getattr(out, counted) == 1
    assert kind != "429" or out.limit_wait_s >= 0.2  # the 429's retry-after reached the client


def test_a_context_error_is_final_and_sent_once(tmp_path: Path) -> None:
    with InProcessModel(context_error="anthropic") as model:
        with pytest.raises(ProviderError) as err:
            ask(model.litellm_model, tmp_path)
        assert model.stats()["total_received"] == 1
    assert err.value.kind == "context_length" and "prompt is too long" in str(err.value)


def test_a_refusal_and_a_reply_cut_at_max_tokens_reach_the_client(tmp_path: Path) -> None:
    with InProcessModel(content_filter_steps=("infer",)) as model:
        refused = ask(model.litellm_model, tmp_path)
    assert refused.refused and not refused.text
    with InProcessModel(length_steps=("infer",), length_whole=True) as model:
        cut = ask(model.litellm_model, tmp_path)
        assert model.stats()["faults"]["infer"]["length"] >= 1
    assert cut.finish_reason == "length"


def test_a_knob_that_needs_the_wire_is_refused_not_ignored() -> None:
    for knobs in ({"rate_slow": 1.0}, {"rpm": 60}, {"fail_first": 1, "fail_first_kind": "truncated"}):
        with pytest.raises(ValueError, match="needs the wire"):
            InProcessModel(**knobs)


def test_a_knob_is_set_by_its_flat_name_and_a_misspelt_or_flat_assigned_one_fails() -> None:
    cfg = StubConfig(rate_429=0.5, garbage_steps=("judge",), rpm=60, latency_ms=5, seed=3)
    assert (cfg.faults.rate_429, cfg.replies.garbage_steps, cfg.limits.rpm, cfg.wire.latency_ms, cfg.seed) == (
        0.5, ("judge",), 60, 5, 3)
    assert stub_arguments(["--rate-429", "0.5", "--garbage-steps", "judge"], "")[1].knobs() == StubConfig(
        rate_429=0.5, garbage_steps=("judge",)).knobs()
    with pytest.raises(TypeError, match="no knob 'rate429'"):
        StubConfig(rate429=0.5)
    with pytest.raises(AttributeError):
        cfg.latency_ms = 0  # type: ignore[attr-defined]  # (would change nothing: the stub reads cfg.wire)
