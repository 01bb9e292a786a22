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
    assert set(found) == {"pending_cache_writes", "logging_worker", "internal_call_flag", "callback_manager",
                          "custom_llm_setup", "developer_role"}


def test_the_legacy_cache_callback_is_dropped() -> None:
    import litellm

    litellm.success_callback.append("cache")
    _litellm.drop_legacy_cache_callbacks()
    assert "cache" not in litellm.success_callback


def test_a_developer_message_reaches_the_api_as_developer(tmp_path) -> None:
    """The official tool sends its GPT-4o evaluator's instructions as 'developer'; litellm alone would send 'system'."""
    import asyncio

    from conftest import compose_config
    from helpers.stub_llm_server import StubServer

    from cupid_exp.job import typed_config
    from cupid_exp.llm.client import LLMClient, configure_litellm
    from cupid_exp.llm.usage import UsageMeter

    with StubServer(record_bodies=True) as stub:
        cfg = typed_config(compose_config(["evaluator=gpt4o", f"evaluator.judge.api_base={stub.url}",
                                           f"paths.output_root={tmp_path}", "runtime.cache=false"]))
        configure_litellm(cfg.runtime)
        import os
        os.environ.setdefault("OPENAI_API_KEY", "sk-test-not-a-key")
        client = LLMClient(cfg.evaluator.judge, cfg.runtime, UsageMeter())
        messages = [{"role": cfg.evaluator.judge.system_role, "content": "S"}, {"role": "user", "content": "U"}]
        asyncio.run(client.complete(messages, step="judge"))
        assert cfg.evaluator.judge.litellm_model == "openai/gpt-4o-2024-11-20"
        assert [m["role"] for m in stub.bodies[0]["messages"]] == ["developer", "user"]
