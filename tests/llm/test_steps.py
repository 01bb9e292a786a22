"""The one step engine: ask, parse, ask again on an unusable reply, then fail as counted."""

from __future__ import annotations

import asyncio

import pytest

from cupid_exp.config import CallsConfig, ModelConfig
from cupid_exp.llm.client import LLMClient, configure_litellm
from cupid_exp.llm.replies import Invalid, ParseError
from cupid_exp.llm.steps import Reask, Resample, StepFailed, Transcript, ask
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.testing.fault_server import ScriptedServer, completion_body

ASK = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]


def client(url: str, tmp_path, meter: UsageMeter, **params) -> LLMClient:
    rt = CallsConfig(cache_dir=str(tmp_path / "c"), cache=False, num_retries=0, timeout=10)
    configure_litellm(rt)
    return LLMClient(ModelConfig(name="s", litellm_model="openai/scripted", api_base=url, params=params), rt, meter)


def number(text: str) -> int:
    if not text.strip().isdigit():
        raise ParseError(f"not a number: {text!r}")
    return int(text)


def test_reask_shows_the_reply_and_the_reason_then_succeeds(tmp_path) -> None:
    script = [(200, completion_body("seven"), {}), (200, completion_body("7"), {})]
    meter, transcript = UsageMeter(), Transcript()
    with ScriptedServer(script) as server:
        value = asyncio.run(ask(client(server.url, tmp_path, meter), "count", ASK, number,
                                transcript=transcript, retry=Reask(1)))
        second = server.requests[1]["messages"]
    assert value == 7
    assert second[:2] == ASK and second[2] == {"role": "assistant", "content": "seven"}
    assert "not a number" in second[3]["content"]
    assert transcript.raw["count"] == ["seven", "7"] and transcript.usage["count"]["calls"] == 2
    assert meter.as_dict()["count"]["unparseable_attempt"] == 1 and not transcript.errors


def test_resample_appends_the_attempt_and_moves_the_seed(tmp_path) -> None:
    def positive(text: str) -> int:
        value = number(text)
        if value <= 0:
            raise Invalid(["the number must be positive"])
        return value

    script = [(200, completion_body("0"), {}), (200, completion_body("3"), {})]
    with ScriptedServer(script) as server:
        value = asyncio.run(ask(client(server.url, tmp_path, UsageMeter(), seed=5), "n", ASK, positive,
                                transcript=Transcript(), retry=Resample(2)))
        first, second = server.requests
    assert value == 3
    assert first["seed"] == 5 and second["seed"] == 6
    assert len(second["messages"]) == 2 and "(Attempt 2." in second["messages"][1]["content"]
    assert "must be positive" in second["messages"][1]["content"]


def test_attempts_run_out_into_a_counted_failure(tmp_path) -> None:
    meter = UsageMeter()
    with ScriptedServer([(200, completion_body("nope"), {})]) as server:
        with pytest.raises(StepFailed) as err:
            asyncio.run(ask(client(server.url, tmp_path, meter), "count", ASK, number, transcript=Transcript(),
                            retry=Reask(2)))
        assert len(server.requests) == 3
    assert (err.value.step, err.value.kind) == ("count", "unparseable")
    assert meter.as_dict()["count"]["gave_up"] == 1


def cut(text: str) -> dict:
    """A reply that ran into max_tokens: finish_reason "length", whatever its text."""
    body = completion_body(text)
    body["choices"][0]["finish_reason"] = "length"
    return body


def test_a_cut_reply_that_parses_is_asked_again_once_with_twice_the_max_tokens(tmp_path) -> None:
    transcript, meter = Transcript(), UsageMeter()
    with ScriptedServer([(200, cut("7"), {}), (200, completion_body("8"), {})]) as server:
        value = asyncio.run(ask(client(server.url, tmp_path, meter, max_tokens=50), "count", ASK, number,
                                transcript=transcript, retry=Reask(3)))
        sent = server.requests
    assert value == 8  # the whole reply, not the cut one that parsed
    assert [r["max_tokens"] for r in sent] == [50, 100] and sent[1]["messages"] == ASK  # the same request, longer
    assert meter.as_dict()["count"]["truncated_attempt"] == 1 and not transcript.errors


def test_a_reply_cut_twice_fails_as_truncated_and_is_not_parsed(tmp_path) -> None:
    transcript, meter = Transcript(), UsageMeter()
    with ScriptedServer([(200, cut("7"), {})]) as server:
        with pytest.raises(StepFailed) as err:
            asyncio.run(ask(client(server.url, tmp_path, meter, max_tokens=50), "count", ASK, number,
                            transcript=transcript, retry=Reask(3)))
        sent = server.requests
    assert [r["max_tokens"] for r in sent] == [50, 100]  # one more request, never a re-ask
    assert (err.value.step, err.value.kind) == ("count", "truncated") and "max_tokens=100" in str(err.value)
    assert transcript.raw["count"] == ["7", "7"]  # the cut texts are kept
    assert meter.as_dict()["count"]["truncated_attempt"] == 2


@pytest.mark.parametrize("model_max_tokens,sent", [(10_000, [10_000, 16_384]), (16_384, [16_384]), (None, [None])])
def test_the_longer_request_stops_at_the_models_longest_reply(tmp_path, model_max_tokens, sent) -> None:
    """gpt-4o gives at most 16,384 tokens (litellm's map): a request already there, or one that set no max_tokens
    (the provider's default cut it), fails at its first cut."""
    rt = CallsConfig(cache_dir=str(tmp_path / "c"), cache=False, num_retries=0, timeout=10)
    configure_litellm(rt)
    params = {} if model_max_tokens is None else {"max_tokens": model_max_tokens}
    with ScriptedServer([(200, cut('{"summaries": [{"session'), {})]) as server:
        model = ModelConfig(name="g", litellm_model="openai/gpt-4o", api_base=server.url, params=params)
        with pytest.raises(StepFailed) as err:
            asyncio.run(ask(LLMClient(model, rt, UsageMeter()), "summarize", ASK, number, transcript=Transcript()))
        assert [r.get("max_tokens") for r in server.requests] == sent
    assert err.value.kind == "truncated"


def test_a_provider_failure_is_a_step_failure_of_its_kind(tmp_path) -> None:
    with ScriptedServer([(500, {"error": {"message": "down"}}, {})]) as server:
        with pytest.raises(StepFailed) as err:
            asyncio.run(ask(client(server.url, tmp_path, UsageMeter()), "s", ASK, number, transcript=Transcript()))
    assert err.value.kind == "provider"


def test_a_bug_in_a_parser_is_not_a_step_failure(tmp_path) -> None:
    def broken(text: str) -> int:
        raise TypeError("a bug, not a bad reply")

    with ScriptedServer([(200, completion_body("1"), {})]) as server:
        with pytest.raises(TypeError):
            asyncio.run(ask(client(server.url, tmp_path, UsageMeter()), "s", ASK, broken, transcript=Transcript()))


def test_a_step_that_keeps_cut_replies_uses_one_as_it_is_and_counts_it(tmp_path) -> None:
    """Synthesis's assistant simulator: its short max_tokens is the recipe's length, not a failure."""
    meter = UsageMeter()
    with ScriptedServer([(200, cut("7"), {})]) as server:
        value = asyncio.run(ask(client(server.url, tmp_path, meter, max_tokens=50), "assistant_simulator", ASK,
                                number, transcript=Transcript(), retry=Resample(0), keep_cut=True))
        assert len(server.requests) == 1
    counts = meter.as_dict()["assistant_simulator"]
    assert value == 7 and counts["truncated_kept"] == 1 and "truncated_attempt" not in counts
