"""The synthesis retry policy: each retry samples hotter with a moved seed; embedded models get the
recipe's repetition samplers on every attempt, API models never."""

from __future__ import annotations

from types import SimpleNamespace

from cupid_exp.config import LocalModelConfig, ModelConfig
from cupid_exp.synthesis.steps.base import WarmerResample

SAMPLERS = {"repeat_penalty": 1.1, "dry_multiplier": 0.8}


def client(temperature: float, embedded: bool) -> SimpleNamespace:
    local = LocalModelConfig(gguf="x.gguf") if embedded else None
    return SimpleNamespace(model=ModelConfig(name="m", litellm_model="llamacpp/m" if embedded else "openai/m",
                                             params={"temperature": temperature, "seed": 5}, local=local))


def test_retries_sample_hotter_with_a_moved_seed_up_to_the_ceiling() -> None:
    policy = WarmerResample(3)
    api = client(0.7, embedded=False)
    assert policy.params(api, 0) is None  # the first attempt is the recipe's own
    assert [policy.params(api, a) for a in (1, 2, 3)] == [{"seed": 6, "temperature": 1.0},
                                                         {"seed": 7, "temperature": 1.3},
                                                         {"seed": 8, "temperature": 1.3}]
    greedy = client(0, embedded=False)  # decomposer and validator: a moved seed alone changes nothing at 0
    assert policy.params(greedy, 1)["temperature"] == 0.3
    assert WarmerResample(1).params(client(1.5, embedded=False), 1)["temperature"] == 1.5  # never cooler


def test_repetition_samplers_go_to_embedded_models_only_on_every_attempt() -> None:
    policy = WarmerResample(2, embedded_sampling=SAMPLERS)
    assert policy.params(client(0.7, embedded=True), 0) == SAMPLERS
    assert policy.params(client(0.7, embedded=True), 1) == {**SAMPLERS, "seed": 6, "temperature": 1.0}
    assert policy.params(client(0.7, embedded=False), 0) is None
    assert "repeat_penalty" not in policy.params(client(0.7, embedded=False), 1)
