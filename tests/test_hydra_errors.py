"""Hydra's composition errors in one line of ours (``cupid_exp.hydra_errors``), from the messages Hydra raises."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from cupid_exp.config import moved_key
from cupid_exp.config_store import register_configs
from cupid_exp.hydra_errors import one_line
from cupid_exp.resources import conf_dir


def _refusal(override: str) -> str:
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"), pytest.raises(Exception) as err:
        compose("config", overrides=[override])
    return f"{err.value}\n{err.value.__cause__}"  # as the command line prints it: the error, then its cause


@pytest.mark.parametrize("override,said", [
    # the call settings left runtime for a group of their own: the old spelling names the new one, not "+runtime..."
    ("runtime.cache=false", "(moved: calls.cache=false)"),
    ("runtime.max_cost_usd=5", "(moved: calls.max_cost_usd=5)"),
    ("runtime.cachex=false", "(a new key: +runtime.cachex=false)"),  # a key no group has: Hydra's own hint
    # a model's pool limits and prices became groups of its own
    ("model.rpm=300", "(moved: model.pool.rpm=300)"),
    ("evaluator.judge.input_cost_per_token=1e-06", "(moved: evaluator.judge.model_info.input_cost_per_token=1e-06)"),
    ("model.pool=shared", "(moved: model.pool.name=shared)"),
    ("data.rpm=300", "(a new key: +data.rpm=300)"),  # no model config: nothing moved from there
])
def test_a_key_hydra_refuses_is_one_line_with_the_hint_that_fits(override: str, said: str) -> None:
    line = one_line(_refusal(override), moved_key)
    assert line is not None and "\n" not in line
    assert override.split("=")[0] in line.split(":")[0] and said in line, line
