"""Rate limits waited out as the provider asks (every header style, any length), bounded by patience, not by
``calls.num_retries``, and a wait beyond the patience a stop of the job for later; fatal refusals (billing states
included) not retried. Against the OpenAI-like limits of the stub server."""

from __future__ import annotations

import asyncio
import pickle
import time
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from pathlib import Path

import pytest

from cupid_exp.config import CallsConfig, ModelConfig
from cupid_exp.llm.client import LLMClient, configure_litellm
from cupid_exp.llm.pools import Pool, forget_pools
from cupid_exp.llm.retry import FatalProviderError, RetryLater, parse_duration, retry_after_s, told_limits
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.testing.fault_server import ScriptedServer, completion_body
from cupid_exp.testing.stub_llm_server import StubServer

NOW = 1_800_000_000.0


@pytest.mark.parametrize("headers,body,seconds", [
    ({"retry-after-ms": "1500", "retry-after": "2"}, "", 1.5),  # the precise one wins
    ({"retry-after": "2"}, "", 2.0),
    ({"retry-after": "90"}, "", 90.0),  # litellm ignores anything over 60 s
    ({"Retry-After": format_datetime(datetime.fromtimestamp(NOW + 30, timezone.utc), usegmt=True)}, "", 30.0),
    ({"x-ratelimit-reset-requests": "1.2s", "x-ratelimit-reset-tokens": "6m0s"}, "", 360.0),  # the later reset
    ({"x-ratelimit-reset-tokens": "20ms"}, "", 0.02),
    ({"anthropic-ratelimit-requests-reset":
      (datetime.fromtimestamp(NOW, timezone.utc) + timedelta(seconds=42)).isoformat().replace("+00:00", "Z")}, "",
     42.0),
    ({}, "Rate limit reached for gpt-4o ... Please try again in 1.2s. Visit ...", 1.2),
    ({}, "Rate limit reached. Please try again in 350ms.", 0.35),
    ({}, "... on requests per day (RPD): Limit 200, Used 200, Requested 1. Please try again in 7m12s. Visit", 432.0),
    ({}, "slow down", None),
])
def test_each_header_style_gives_the_wait(headers, body, seconds) -> None:
    got = retry_after_s(headers, body, now=NOW)
    assert got == pytest.approx(seconds) if seconds is not None else got is None


def test_durations_and_stated_limits() -> None:
    assert parse_duration("1h2m3.5s") == pytest.approx(3723.5)
    assert parse_duration("soon") is None
    assert told_limits({"x-ratelimit-limit-requests": "300", "x-ratelimit-limit-tokens": "400000"}) == (300, 400000)
    assert told_limits({"anthropic-ratelimit-requests-limit": "50"}) == (50, None)


def client(url: str, tmp_path: Path, model: ModelConfig | None = None, **runtime) -> tuple[LLMClient, UsageMeter]:
    forget_pools()
    rt = CallsConfig(cache_dir=str(tmp_path / "cache"), cache=False,
                       **{"num_retries": 1, "timeout": 10, **runtime})
    configure_litellm(rt)
    meter = UsageMeter()
    model = model or ModelConfig(name="stub", litellm_model="openai/stub", api_base=url, max_concurrency=8)
    return LLMClient(model, rt, meter), meter


def ask(c: LLMClient, text: str = "hello", n: int = 1) -> list:
    async def run():
        return await asyncio.gather(*(c.complete([{"role": "user", "content": f"{text} {i}"}], step="s")
                                      for i in range(n)), return_exceptions=True)
    return asyncio.run(run())


@pytest.mark.slow
def test_a_limit_that_lifts_is_waited_out_beyond_num_retries(tmp_path: Path) -> None:
    # every request refused for 3 s: with num_retries=1 the old client gave up after 2 requests
    with StubServer(closed_s=3.0) as stub:
        c, meter = client(stub.url, tmp_path, num_retries=1)
        start = time.perf_counter()
        out = ask(c, n=4)
        elapsed = time.perf_counter() - start
        st = stub.stats()
    assert all(not isinstance(o, BaseException) for o in out), out
    assert st["rate_limited"] >= 4 and st["total_completed"] == 4
    assert 2.5 <= elapsed < 15
    counts = meter.as_dict()["s"]
    assert counts["calls"] == 4 and counts["rate_limited"] == st["rate_limited"] and counts.get("retries", 0) == 0
    assert counts["limit_wait_s"] >= 2.5


def test_a_wait_longer_than_a_minute_is_honoured(tmp_path: Path, monkeypatch) -> None:
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds, *args, **kwargs):  # no test waits 90 s: record it and go on
        if seconds >= 1:
            waits.append(seconds)
            seconds = 0
        return await real_sleep(seconds, *args, **kwargs)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    # the pool's pause would spin on the patched sleep for the real 90 s: the call's own wait is the one checked
    monkeypatch.setattr(Pool, "pause", lambda self, seconds: None)
    script = [(429, {"error": {"message": "Rate limit reached", "type": "requests", "param": None,
                               "code": "rate_limit_exceeded"}}, {"retry-after": "90"}),
              (200, completion_body("hello"), {})]
    with ScriptedServer(script) as server:
        c, meter = client(server.url, tmp_path)
        (out,) = ask(c)
    assert out.text == "hello" and len(server.requests) == 2
    assert 90 in waits  # litellm would have used its own 0.5-8 s backoff instead


def test_a_call_waiting_out_a_429_lets_another_call_take_its_concurrency_slot(tmp_path: Path, monkeypatch) -> None:
    # an overloaded provider's sporadic 429 pauses no one else (``Pool.rate_limited``, ``RefusalPace.news``): the
    # pool's pause is left out here so that only the call's own wait is in play
    monkeypatch.setattr(Pool, "pause", lambda self, seconds: None)
    script = [(429, {"error": {"message": "overloaded", "type": "requests", "param": None,
                               "code": "rate_limit_exceeded"}}, {"retry-after": "1"}),
              (200, completion_body("hello"), {})]
    with ScriptedServer(script) as server:
        model = ModelConfig(name="stub", litellm_model="openai/stub", api_base=server.url, max_concurrency=1)
        c, meter = client(server.url, tmp_path, model)
        first, second = ask(c, n=2)
    sent = [r["messages"][-1]["content"] for r in server.requests]
    assert meter.as_dict()["s"]["rate_limited"] == 1 and first.text == second.text == "hello"  # the 429 was sent
    # one slot: the refused call's retry comes after the other call, sent while the first waited its second
    assert sent == ["hello 0", "hello 1", "hello 0"], sent


@pytest.mark.slow
def test_a_permanent_limit_stops_the_job_for_later_at_the_patience_deadline(tmp_path: Path) -> None:
    with StubServer(closed_s=float("inf")) as stub:
        c, meter = client(stub.url, tmp_path, rate_limit_patience_s=2.5)
        start = time.perf_counter()
        (err,) = ask(c)
        elapsed = time.perf_counter() - start
        st = stub.stats()
        after = ask(c, n=3)  # the job has stopped: nothing more is sent
        assert stub.stats()["total_received"] == st["total_received"]
    assert isinstance(err, RetryLater) and err.outcome == "retry_later"  # the job's stop, not the call's failure
    assert "calls.rate_limit_patience_s=2.5" in str(err) and "\n" not in str(err)
    assert "run the same command later" in str(err) and "requests per min" in str(err)  # the provider's words
    assert 1.5 <= elapsed < 6
    counts = meter.as_dict()["s"]
    assert counts["failed_rate_limit"] == 1 and counts.get("calls", 0) == 0
    assert st["total_received"] == 1 + counts["rate_limited"] >= 3  # each 1 s retry-after honoured
    assert all(isinstance(o, RetryLater) for o in after)


DAILY = {"error": {"message": "Rate limit reached for gpt-4o in organization org-x on requests per day (RPD): "
                              "Limit 200, Used 200, Requested 1. Please try again in 1h0m0s.",
                   "type": "requests", "param": None, "code": "rate_limit_exceeded"}}


def test_a_wait_beyond_patience_stops_the_job_at_once_naming_the_limit_and_the_wait(tmp_path: Path) -> None:
    with ScriptedServer([(429, DAILY, {"retry-after": "3600"})]) as server:
        c, meter = client(server.url, tmp_path, rate_limit_patience_s=1800)
        start = time.perf_counter()
        out = ask(c, n=3)
        elapsed = time.perf_counter() - start
    assert all(isinstance(o, RetryLater) for o in out) and elapsed < 5  # not waited: the job stops
    assert len(server.requests) <= 3  # the calls in flight at most, none retried
    line = str(out[0])
    assert "requests per day" in line and "wait 3600 s" in line and "rate_limit_patience_s=1800" in line
    assert pickle.loads(pickle.dumps(out[0])).outcome == "retry_later"  # crosses from a worker process intact
    assert retry_after_s({}, DAILY["error"]["message"]) == 3600.0  # without the header, the message says it


@pytest.mark.parametrize("code", ["insufficient_quota", "credit_balance_exhausted", "project_spend_limit_exceeded",
                                  "organization_spend_limit_exceeded", "organization_usage_limit_exceeded"])
def test_a_billing_state_is_a_fatal_refusal_not_a_rate_limit(tmp_path: Path, code: str) -> None:
    body = {"error": {"message": "You exceeded your current quota, please check your plan and billing details.",
                      "type": code, "param": None, "code": code}}
    with ScriptedServer([(429, body, {"retry-after": "1"})]) as server:
        c, meter = client(server.url, tmp_path, num_retries=3)
        (err,) = ask(c)
    assert isinstance(err, FatalProviderError) and not isinstance(err, RetryLater) and err.kind == code
    assert len(server.requests) == 1 and err.outcome == "error"


@pytest.mark.parametrize("refuse,kind", [("401", "auth"), ("403", "auth"), ("404", "model_not_found")])
def test_a_fatal_refusal_is_sent_once_and_not_retried(tmp_path: Path, refuse: str, kind: str) -> None:
    with StubServer(refuse=refuse) as stub:
        c, meter = client(stub.url, tmp_path, num_retries=3)
        out = ask(c, n=6)
        st = stub.stats()
    assert all(isinstance(o, FatalProviderError) and o.kind == kind for o in out), out
    # the calls in flight when the first refusal came were already sent; none after it, none retried
    assert st["total_received"] <= 6 and meter.as_dict()["s"].get("retries", 0) == 0
    assert refuse in str(out[0]) and "stub" in str(out[0])
    after = ask(c, n=3)  # the endpoint is known refusing: nothing more is sent
    assert all(isinstance(o, FatalProviderError) for o in after) and stub.stats()["total_received"] == st[
        "total_received"]


def test_an_endpoint_that_never_accepts_a_connection_is_fatal(tmp_path: Path) -> None:
    model = ModelConfig(name="nowhere", litellm_model="openai/stub", api_base="http://127.0.0.1:9/v1")
    c, meter = client("", tmp_path, model, num_retries=5)
    (err,) = ask(c)
    assert isinstance(err, FatalProviderError) and err.kind == "unreachable"
    assert meter.as_dict()["s"]["retries"] == 2  # the third refusal, no success ever: stop


def test_the_key_never_reaches_a_fatal_message(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CUPID_TEST_KEY", "sk-test-SECRET-123")
    body = {"error": {"message": "Incorrect API key provided: sk-test-SECRET-123.", "type": "invalid_request_error",
                      "param": None, "code": "invalid_api_key"}}
    with ScriptedServer([(401, body, {})]) as server:
        model = ModelConfig(name="k", litellm_model="openai/scripted", api_base=server.url,
                            api_key_env="CUPID_TEST_KEY")
        c, _ = client(server.url, tmp_path, model)
        (err,) = ask(c)
    assert isinstance(err, FatalProviderError) and "SECRET" not in str(err) and "invalid_api_key" in str(err)
