"""The README's setting sweeps compose: the retrieval knobs belong to the retrieval setting's schema, so a sweep
over them names ``setting=retrieval``; given to another setting, or misspelt, they stop at composition."""

from __future__ import annotations

import itertools

import pytest
from conftest import compose_config
from hydra.errors import ConfigCompositionException

# The README's commands (section "Tasks, settings and evaluators"), each swept value list expanded as Hydra does
README_SWEEPS = [["setting=standard,oracle,retrieval"], ["setting=retrieval", "setting.retriever=embedding,recency"]]


def expand(sweep: list[str]) -> list[list[str]]:
    keys, values = zip(*(o.split("=", 1) for o in sweep), strict=False)
    return [[f"{k}={v}" for k, v in zip(keys, combo, strict=True)]
            for combo in itertools.product(*(v.split(",") for v in values))]


@pytest.mark.parametrize("sweep", README_SWEEPS, ids=lambda s: " ".join(s))
def test_the_readme_setting_sweeps_compose(sweep: list[str]) -> None:
    for overrides in expand(sweep):
        cfg = compose_config(overrides)
        assert cfg.setting.name == overrides[0].split("=")[1]
        if len(overrides) > 1:
            assert cfg.setting.retriever == overrides[1].split("=")[1]


@pytest.mark.parametrize("overrides, message", [
    (["setting=standard", "setting.retriever=embedding"], "Key 'retriever' not in 'StandardConfig'"),
    (["setting=retrieval", "setting.retreiver=embedding"], "Key 'retreiver' not in 'RetrievalConfig'"),
])
def test_a_retrieval_knob_elsewhere_or_misspelt_fails_at_composition(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(overrides)
    assert message in str(err.value.__cause__ or err.value)
