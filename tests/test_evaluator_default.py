"""Which evaluator a job gets when none is named: the one its model file declares (conf/model/*.yaml,
``override /evaluator``): the paper's GPT-4o protocol for API models, the embedded one for embedded
models. An explicit ``evaluator=...`` always wins, and swapping one evaluator role changes nothing else."""

from __future__ import annotations

import pytest
from conftest import CONF_DIR, compose_config
from omegaconf import OmegaConf

MODELS = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))


def composed(*overrides: str):
    cfg = compose_config(list(overrides), return_hydra_config=True)
    return cfg, dict(cfg.hydra.runtime.choices)


@pytest.mark.parametrize("model", MODELS)
def test_api_models_imply_the_paper_evaluator_and_embedded_ones_the_local_one(model: str) -> None:
    cfg, choices = composed(f"model={model}")
    expected = "local" if cfg.model.local is not None else "gpt4o"
    assert choices["evaluator"] == expected and cfg.evaluator.name == expected
    if expected == "gpt4o":
        assert {cfg.evaluator[r].litellm_model for r in ("decomposer", "matcher", "judge")} == {
            "openai/gpt-4o-2024-11-20"}


def test_both_kinds_are_shipped() -> None:
    implied = {m: composed(f"model={m}")[1]["evaluator"] for m in MODELS}
    assert implied["local"] == implied["local_gemma"] == "local"
    assert all(implied[m] == "gpt4o" for m in ("gpt4o", "claude", "claude37", "claude35", "deepseek_r1",
                                               "openai_compatible", "gemini_pro", "mistral7b"))


def test_the_offline_demo_keeps_the_local_evaluator() -> None:
    cfg, choices = composed()
    assert (choices["model"], choices["evaluator"], cfg.evaluator.name) == ("local", "local", "local")


def test_model_claude_is_claude_37_sonnet_as_in_the_paper() -> None:
    cfg, choices = composed("model=claude")
    assert cfg.model.name == "claude37" and cfg.model.litellm_model.endswith("claude-3-7-sonnet-20250219")
    assert cfg.model.params.thinking.budget_tokens == 1024 and choices["evaluator"] == "gpt4o"


@pytest.mark.parametrize("overrides, expected", [
    (["model=gpt4o", "evaluator=local"], "local"),
    (["evaluator=local", "model=gpt4o"], "local"),  # the order on the command line does not matter
    (["model=claude", "evaluator=prefmatcher"], "prefmatcher"),
    (["model=local", "evaluator=gpt4o"], "gpt4o"),
    (["model=local_gemma", "evaluator=prefmatcher"], "prefmatcher"),
])
def test_an_explicit_evaluator_wins_over_the_models_default(overrides: list[str], expected: str) -> None:
    cfg, choices = composed(*overrides)
    assert choices["evaluator"] == expected and cfg.evaluator.name == expected


def test_swapping_one_role_keeps_the_evaluator_the_model_implies() -> None:
    cfg, choices = composed("model=local", "llm@evaluator.judge=gpt4o_eval")
    assert choices["evaluator"] == "local" and cfg.evaluator.judge.name == "gpt4o_eval"
    assert cfg.evaluator.matcher.name == "local"
    cfg, choices = composed("model=gpt4o", "llm@evaluator.matcher=claude35")
    assert choices["evaluator"] == "gpt4o" and cfg.evaluator.matcher.name == "claude35"
    assert cfg.evaluator.judge.name == "gpt4o_eval"


def test_the_composed_config_shows_the_evaluator_that_runs() -> None:
    """What --cfg job prints (and MLflow's params come from): evaluator.name and its roles, resolved."""
    plain = OmegaConf.to_container(compose_config(["model=deepseek_r1"]), resolve=True)
    assert plain["evaluator"]["name"] == "gpt4o" and plain["evaluator"]["judge"]["name"] == "gpt4o_eval"
