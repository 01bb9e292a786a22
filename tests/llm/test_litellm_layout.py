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
                          "custom_llm_setup"}


def test_the_legacy_cache_callback_is_dropped() -> None:
    import litellm

    litellm.success_callback.append("cache")
    _litellm.drop_legacy_cache_callbacks()
    assert "cache" not in litellm.success_callback
