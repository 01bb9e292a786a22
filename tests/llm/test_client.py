"""The client layer: cache keys, retries, error kinds, prices, shared Routers (the embedded model: test_local.py)."""

from __future__ import annotations

import asyncio

import pytest

from cupid_exp.config import CallsConfig, ModelConfig, ModelInfo
from cupid_exp.llm.client import LLMClient, ProviderError, configure_litellm
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.testing.fault_server import ScriptedServer, completion_body


def runtime(tmp_path, **kw) -> CallsConfig:
    rt = CallsConfig(cache_dir=str(tmp_path / "cache"), num_retries=kw.pop("num_retries", 2), timeout=30,
                       **kw)
    configure_litellm(rt)
    return rt


def test_cache_namespace_covers_api_base_params_and_schema(tmp_path) -> None:
    rt = runtime(tmp_path)
    base = ModelConfig(name="m", litellm_model="openai/x", api_base="http://127.0.0.1:1/v1",
                       params={"temperature": 0}, structured_output=True)
    ns = LLMClient(base, rt, UsageMeter()).cache_namespace(None)
    variants = [
        ModelConfig(name="m", litellm_model="openai/x", api_base="http://127.0.0.1:2/v1",
                    params={"temperature": 0}, structured_output=True),
        ModelConfig(name="m", litellm_model="openai/x", api_base="http://127.0.0.1:1/v1",
                    params={"temperature": 0.7}, structured_output=True),
        ModelConfig(name="m", litellm_model="openai/y", api_base="http://127.0.0.1:1/v1",
                    params={"temperature": 0}, structured_output=True),
    ]
    assert all(LLMClient(v, rt, UsageMeter()).cache_namespace(None) != ns for v in variants)
    assert LLMClient(base, rt, UsageMeter()).cache_namespace({"type": "object"}) != ns
    assert LLMClient(base, rt, UsageMeter()).cache_namespace(None) == ns  # stable


def test_retries_transient_errors_then_succeeds(tmp_path) -> None:
    script = [(503, {"error": {"message": "busy"}}, {}), (429, {"error": {"message": "slow down"}},
                                                         {"retry-after": "0"}),
              (200, completion_body("hello"), {})]
    with ScriptedServer(script) as server:
        model = ModelConfig(name="flaky", litellm_model="openai/scripted", api_base=server.url)
        meter = UsageMeter()
        out = asyncio.run(LLMClient(model, runtime(tmp_path, cache=False), meter).complete(
            [{"role": "user", "content": "hi"}], step="s"))
    assert out.text == "hello"
    assert len(server.requests) == 3
    assert out.prompt_tokens == 7 and meter.as_dict()["s"]["calls"] == 1


@pytest.mark.parametrize("status,body,kind", [
    (500, {"error": {"message": "internal"}}, "provider"),
    (400, {"error": {"message": "This model's maximum context length is 8192 tokens",
                     "code": "context_length_exceeded"}}, "context_length"),
])
def test_give_up_is_classified_and_counted(tmp_path, status, body, kind) -> None:
    with ScriptedServer([(status, body, {})]) as server:
        model = ModelConfig(name="broken", litellm_model="openai/scripted", api_base=server.url)
        meter = UsageMeter()
        with pytest.raises(ProviderError) as err:
            asyncio.run(LLMClient(model, runtime(tmp_path, cache=False, num_retries=1), meter).complete(
                [{"role": "user", "content": "hi"}], step="s"))
    assert err.value.kind == kind
    assert meter.as_dict()["s"][f"failed_{kind}"] == 1


def test_api_key_reaches_the_provider_but_not_the_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CUPID_TEST_KEY", "sk-test-SECRET-123")
    with ScriptedServer([(500, {"error": {"message": "internal"}}, {})]) as server:
        model = ModelConfig(name="k", litellm_model="openai/scripted", api_base=server.url,
                            api_key_env="CUPID_TEST_KEY")
        with pytest.raises(ProviderError) as err:
            asyncio.run(LLMClient(model, runtime(tmp_path, cache=False, num_retries=0), UsageMeter()).complete(
                [{"role": "user", "content": "hi"}], step="s"))
    assert "SECRET" not in str(err.value)


def test_api_model_calls_are_priced_from_litellms_map(tmp_path) -> None:
    """Regression: the Router's empty price entry used to make every gpt-4o call cost $0."""
    body = {**completion_body("hello"), "model": "gpt-4o-2024-08-06"}  # as OpenAI answers
    with ScriptedServer([(200, body, {})]) as server:
        model = ModelConfig(name="gpt4o", litellm_model="openai/gpt-4o-2024-08-06", api_base=server.url)
        meter = UsageMeter()
        out = asyncio.run(LLMClient(model, runtime(tmp_path, cache=False), meter).complete(
            [{"role": "user", "content": "hi"}], step="s"))
    # 7 prompt + 3 completion tokens at gpt-4o's listed prices ($2.50 / $10 per million)
    assert out.cost_usd == pytest.approx(7 * 2.5e-6 + 3 * 1e-5)
    assert meter.as_dict()["s"]["cost_usd"] == pytest.approx(out.cost_usd)


def test_the_provider_is_resolved_once_per_client_not_on_the_event_loop_per_call(tmp_path, monkeypatch) -> None:
    """litellm's ``acompletion`` resolved each call's provider on the event loop (a pydantic check of every option,
    then the lookup) unless given one; the client gives the one it resolved when built. ``completion`` still resolves
    the model's name off the loop, as before, and the call is priced as before."""
    import threading

    import litellm.main

    loop_thread, on_loop = threading.get_ident(), []
    resolve = litellm.main.get_llm_provider

    def counted(*args, **kwargs):
        on_loop.append(threading.get_ident() == loop_thread)
        return resolve(*args, **kwargs)

    monkeypatch.setattr(litellm.main, "get_llm_provider", counted)
    body = {**completion_body("hello"), "model": "gpt-4o-2024-08-06"}
    with ScriptedServer([(200, body, {})] * 3) as server:
        model = ModelConfig(name="gpt4o", litellm_model="openai/gpt-4o-2024-08-06", api_base=server.url)
        client = LLMClient(model, runtime(tmp_path, cache=False), UsageMeter())

        async def three() -> list:
            return [await client.complete([{"role": "user", "content": f"hi {n}"}], step="s") for n in range(3)]

        replies = asyncio.run(three())
    assert len(server.requests) == 3 and [r.text for r in replies] == ["hello"] * 3
    assert on_loop and True not in on_loop  # 3 on the loop before (one per call), beside completion()'s in its thread
    assert replies[0].cost_usd == pytest.approx(7 * 2.5e-6 + 3 * 1e-5)


def test_custom_priced_model_is_costed_at_its_configured_prices(tmp_path) -> None:
    """Regression: a model priced in its config (input/output_cost_per_token) used to cost $0."""
    with ScriptedServer([(200, completion_body("hello"), {})]) as server:
        model = ModelConfig(name="mine", litellm_model="openai/my-model", api_base=server.url,
                            model_info=ModelInfo(input_cost_per_token=1e-6, output_cost_per_token=2e-6))
        meter = UsageMeter()
        out = asyncio.run(LLMClient(model, runtime(tmp_path, cache=False), meter).complete(
            [{"role": "user", "content": "hi"}], step="s"))
    assert out.cost_usd == pytest.approx(7 * 1e-6 + 3 * 2e-6)
    assert meter.as_dict()["s"]["cost_usd"] == pytest.approx(out.cost_usd)


def test_two_configs_of_one_model_id_are_each_costed_at_their_own_prices_and_touch_no_global_state(tmp_path) -> None:
    """A config's prices override litellm's map for that config only: nothing is registered in litellm's global
    price map or callback lists (a Router did both, and a sweep's later jobs paid for every earlier one)."""
    import litellm

    def lists():
        return [len(x) for x in (litellm.success_callback, litellm._async_success_callback,
                                 litellm.failure_callback, litellm._async_failure_callback, litellm.callbacks)]

    body = {**completion_body("hello"), "model": "gpt-4o-2024-08-06"}
    rt = runtime(tmp_path, cache=False)
    before, prices_before = lists(), dict(litellm.model_cost)
    with ScriptedServer([(200, body, {}), (200, body, {})]) as server:
        own = LLMClient(ModelConfig(name="own", litellm_model="openai/gpt-4o-2024-08-06", api_base=server.url,
                                    model_info=ModelInfo(input_cost_per_token=1e-6, output_cost_per_token=2e-6)),
                        rt, UsageMeter())
        listed = LLMClient(ModelConfig(name="listed", litellm_model="openai/gpt-4o-2024-08-06", api_base=server.url),
                           rt, UsageMeter())
        costs = [asyncio.run(c.complete([{"role": "user", "content": "hi"}], step="s")).cost_usd for c in (own, listed)]
    assert costs == [pytest.approx(7 * 1e-6 + 3 * 2e-6), pytest.approx(7 * 2.5e-6 + 3 * 1e-5)]
    assert lists() == before
    assert litellm.model_cost == prices_before


def test_step_params_apply_to_their_step_only_and_the_callers_params_win(tmp_path) -> None:
    with ScriptedServer([(200, completion_body("ok"), {})]) as server:
        model = ModelConfig(name="m", litellm_model="openai/scripted", api_base=server.url,
                            params={"max_tokens": 100, "temperature": 0},
                            step_params={"summarize": {"max_tokens": 900}})
        client = LLMClient(model, runtime(tmp_path, cache=False), UsageMeter())
        say = [{"role": "user", "content": "hi"}]
        asyncio.run(client.complete(say, step="summarize"))
        asyncio.run(client.complete(say, step="infer"))
        asyncio.run(client.complete(say, step="summarize", params={"max_tokens": 50}))
    assert [r["max_tokens"] for r in server.requests] == [900, 100, 50]
    assert all(r["temperature"] == 0 for r in server.requests)
