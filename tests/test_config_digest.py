"""Job identities and synthesis folders survive new optional settings."""

from __future__ import annotations

from cupid_exp.config import config_digest


def test_a_new_null_setting_leaves_the_digest_alone() -> None:
    before = {"model": {"name": "m", "params": {"temperature": 0}}, "runtime": {"reask": 1}}
    after = {"model": {"name": "m", "params": {"temperature": 0}, "context_window": None}, "runtime": {"reask": 1}}
    assert config_digest(before) == config_digest(after)
    assert config_digest(before) != config_digest({**before, "runtime": {"reask": 2}})
    assert config_digest([{"a": None, "b": 1}]) == config_digest([{"b": 1}]) and len(config_digest(before, 8)) == 8
