"""Every private litellm target cupid-exp tunes against must still exist: when an upgrade moves one,
this fails loudly instead of runs getting silently slower (the workarounds degrade to no-ops)."""

from __future__ import annotations

import importlib.metadata

from cupid_exp.llm import _litellm


def test_every_private_target_is_found() -> None:
    found = _litellm.probe()
    missing = [name for name, ok in found.items() if not ok]
    version = importlib.metadata.version("litellm")
    assert not missing, (f"litellm {version} moved {missing}: revisit cupid_exp/llm/_litellm.py "
                         "(the workaround for each is documented there)")
    assert set(found) == {"native_state_flag", "pending_cache_writes", "logging_worker", "internal_call_flag",
                          "custom_llm_setup", "developer_role", "first_call_modules", "cache_args_to_kwargs",
                         "cache_options_adapter", "cost_breakdown"}


def test_the_first_call_imports_almost_nothing_once_the_clients_are_built(tmp_path) -> None:
    """Building the clients imports what litellm and the OpenAI SDK would import on the first request (~580
    modules, ~0.45 s), so that it is start-up cost and not a stall of the model phase. In a fresh process."""
    import subprocess
    import sys
    import textwrap

    from helpers.cli_runner import cli_env

    from cupid_exp.data.loading import SAMPLE_FULL_PATH
    from cupid_exp.testing.cupid_data import stub_overrides
    from cupid_exp.testing.stub_llm_server import StubServer

    with StubServer() as stub:
        overrides = [*stub_overrides(stub.url), f"paths.output_root={tmp_path}", "tracking=none", "data=local",
                     f"data.path={SAMPLE_FULL_PATH}", "data.limit=1", "runtime.progress=false",
                     f"calls.cache_dir={tmp_path / 'cache'}"]
        script = textwrap.dedent(f"""
            import sys
            from hydra import compose, initialize_config_dir
            from cupid_exp.config_store import register_configs
            from cupid_exp.evaluation import plan
            from cupid_exp.job import execute
            from cupid_exp.resources import conf_dir
            register_configs()
            with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
                cfg = compose("config", overrides={overrides!r})
            job = plan(cfg, __import__("pathlib").Path({str(tmp_path / "job")!r}))
            before = set(sys.modules)
            assert len(execute(job).results) == 1
            print("NEW", len(set(sys.modules) - before))
        """)
        proc = subprocess.run([sys.executable, "-c", script], env=cli_env(), capture_output=True, text=True,
                              timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    new = int(proc.stdout.split("NEW")[-1])
    assert new < 60, f"the first calls imported {new} modules"


def test_the_legacy_cache_callback_is_dropped() -> None:
    import litellm

    litellm.success_callback.append("cache")
    _litellm.drop_legacy_cache_callbacks()
    assert "cache" not in litellm.success_callback


def test_a_developer_message_reaches_the_api_as_developer(tmp_path) -> None:
    """The official tool sends its GPT-4o evaluator's instructions as 'developer'; litellm alone would send 'system'."""
    import asyncio

    from conftest import compose_config

    from cupid_exp.job import typed_config
    from cupid_exp.llm.client import LLMClient, configure_litellm
    from cupid_exp.llm.usage import UsageMeter
    from cupid_exp.testing.stub_llm_server import StubServer

    with StubServer(record_bodies=True) as stub:
        cfg = typed_config(compose_config(["evaluator=gpt4o", f"evaluator.judge.api_base={stub.url}",
                                           f"paths.output_root={tmp_path}", "calls.cache=false"]))
        configure_litellm(cfg.calls)
        import os
        os.environ.setdefault("OPENAI_API_KEY", "sk-test-not-a-key")
        client = LLMClient(cfg.evaluator.judge, cfg.calls, UsageMeter())
        messages = [{"role": cfg.evaluator.judge.system_role, "content": "S"}, {"role": "user", "content": "U"}]
        asyncio.run(client.complete(messages, step="judge"))
        assert cfg.evaluator.judge.litellm_model == "openai/gpt-4o-2024-11-20"
        assert [m["role"] for m in stub.bodies[0]["messages"]] == ["developer", "user"]


def test_a_call_through_the_response_cache_computes_no_signature(tmp_path, monkeypatch) -> None:
    """litellm's cache layer computed ``inspect.signature(acompletion)`` on each lookup and each write to name
    positional arguments our calls never pass (``skip_signature_without_positional_args``), and built a pydantic
    ``TypeAdapter`` for each write (``reuse_cache_options_adapter``)."""
    import asyncio
    import inspect
    from collections.abc import Mapping

    from litellm.caching import caching_handler
    from pydantic import TypeAdapter

    from cupid_exp.config import CallsConfig, ModelConfig
    from cupid_exp.llm.client import LLMClient, configure_litellm
    from cupid_exp.llm.pools import forget_pools
    from cupid_exp.llm.usage import UsageMeter
    from cupid_exp.testing.stub_llm_server import StubServer

    signatures: list[object] = []
    real = inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda f, *a, **k: signatures.append(f) or real(f, *a, **k))
    adapters: list[object] = []
    build = TypeAdapter.__init__
    monkeypatch.setattr(TypeAdapter, "__init__", lambda self, t, *a, **k: adapters.append(t) or build(self, t, *a, **k))
    hello = [{"role": "user", "content": "Say hello."}]
    with StubServer() as stub:
        forget_pools()
        settings = CallsConfig(cache_dir=str(tmp_path / "cache"), cache=True, num_retries=0,
                                 timeout=10)
        configure_litellm(settings)
        client = LLMClient(ModelConfig(name="m", litellm_model="openai/stub", api_base=stub.url), settings,
                           UsageMeter())

        async def calls() -> tuple:
            first, again = await client.complete(hello, step="s"), await client.complete(hello, step="s")
            adapters.clear()  # what the first call imported built adapters of its own
            for n in range(3):  # three more writes
                await client.complete([{"role": "user", "content": f"Say {n}."}], step="s")
            return first, again

        first, again = asyncio.run(calls())
        served = stub.stats()["total_completed"]
    assert served == 4 and not first.cached and again.cached  # a lookup and a write, then a lookup that hit
    assert [f for f in signatures if getattr(f, "__name__", None) == "acompletion"] == []
    assert Mapping[str, object] not in adapters  # three writes: none built the cache options' adapter again
    # a caller that does pass positional arguments still has them named by litellm's own function
    assert caching_handler.convert_args_to_kwargs(lambda model, messages: None, ("m", hello)) == {
        "model": "m", "messages": hello}


def test_our_calls_are_priced_once_not_again_by_token_type(tmp_path, monkeypatch) -> None:
    """litellm priced each reply for its total and again by token type for logging callbacks our calls skip
    (``skip_cost_breakdown_of_internal_calls``): the map entry is now read once per reply; the total is unchanged."""
    import asyncio

    import litellm
    from litellm.litellm_core_utils.llm_cost_calc import utils as cost_utils

    from cupid_exp.config import CallsConfig, ModelConfig
    from cupid_exp.llm.client import LLMClient, configure_litellm
    from cupid_exp.llm.pools import forget_pools
    from cupid_exp.llm.usage import UsageMeter
    from cupid_exp.testing.stub_llm_server import StubServer

    priced: list[object] = []
    real = cost_utils._get_token_base_cost
    monkeypatch.setattr(cost_utils, "_get_token_base_cost", lambda *a, **k: priced.append(a) or real(*a, **k))
    with StubServer() as stub:
        forget_pools()
        settings = CallsConfig(cache_dir=str(tmp_path / "cache"), cache=False, num_retries=0,
                                 timeout=10)
        configure_litellm(settings)
        client = LLMClient(ModelConfig(name="m", litellm_model="openai/gpt-4o-2024-11-20", api_base=stub.url),
                           settings, UsageMeter())
        reply = asyncio.run(client.complete([{"role": "user", "content": "Say hello."}], step="s"))
        served = stub.stats()["total_completed"]
    entry = litellm.model_cost["gpt-4o-2024-11-20"]
    assert served == 1 and reply.prompt_tokens and reply.completion_tokens
    assert reply.cost_usd == reply.prompt_tokens * entry["input_cost_per_token"] + \
        reply.completion_tokens * entry["output_cost_per_token"]
    assert len(priced) == 1  # the total's; 2 with the breakdown
    # a call outside ours (the flag unset) still gets litellm's breakdown
    from litellm.cost_calculator import get_token_type_cost_breakdown
    usage = litellm.Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15)
    assert get_token_type_cost_breakdown(model="gpt-4o-2024-11-20", custom_llm_provider="openai",
                                         usage=usage).rates is not None
