"""Settings are found by name, carry their own schema, and say which task parts they allow."""

from __future__ import annotations

import pytest
from conftest import CONF_DIR, compose_config
from hydra.errors import ConfigCompositionException

from cupid_exp.config import ConfigError
from cupid_exp.job.plan import typed_config
from cupid_exp.settings import SETTINGS, make_setting, register_setting_schemas
from cupid_exp.settings.retrieval import RetrievalConfig


def test_every_setting_yaml_is_a_registered_setting_with_its_schema() -> None:
    register_setting_schemas()  # as the CLI does first: the registry is filled then, whichever tests ran before
    yamls = sorted(p.stem for p in (CONF_DIR / "setting").glob("*.yaml"))
    assert yamls == sorted(SETTINGS)
    for name in yamls:
        cfg = typed_config(compose_config([f"setting={name}"]))
        assert isinstance(cfg.setting, SETTINGS[name].Config)
        assert make_setting(cfg.setting).name == name


def test_a_setting_rejects_another_settings_field() -> None:
    with pytest.raises(ConfigCompositionException, match="top_k"):
        compose_config(["setting=standard", "setting.top_k=3"])
    assert typed_config(compose_config(["setting=retrieval", "setting.top_k=3"])).setting.top_k == 3


@pytest.mark.parametrize("parts,setting", [(["inference"], "standard"), (["generation"], "oracle_preference"),
                                           (["inference", "generation"], "summary"),
                                           (["inference", "generation"], "oracle"), (["generation"], "summary")])
def test_valid_combinations_pass(parts: list[str], setting: str) -> None:
    make_setting(typed_config(compose_config([f"setting={setting}"])).setting).check_parts(parts)


@pytest.mark.parametrize("parts", [["inference"], ["inference", "generation"]])
def test_oracle_preference_is_generation_only(parts: list[str]) -> None:
    setting = make_setting(typed_config(compose_config(["setting=oracle_preference"])).setting)
    with pytest.raises(ConfigError) as err:
        setting.check_parts(parts)
    message = str(err.value)
    assert "\n" not in message
    assert "setting=oracle_preference is defined for generation only" in message
    assert "inference" in message


def test_retrieval_label_names_its_variant() -> None:
    assert make_setting(RetrievalConfig(retriever="bm25", top_k=3)).label() == "retrieval[bm25,k=3]"
    emb = make_setting(RetrievalConfig(retriever="embedding", embedding_model="openai/text-embedding-3-small"))
    assert emb.label() == "retrieval[embedding=openai/text-embedding-3-small,k=2]"
    assert make_setting(typed_config(compose_config(["setting=standard"])).setting).label() == "standard"


@pytest.mark.parametrize("override,problem", [("setting.top_k=0", "setting.top_k=0 is not allowed"),
                                              ("setting.retriever=tfidf", "setting.retriever='tfidf'")])
def test_bad_retrieval_values_fail_in_one_line(override: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace("[", r"\[")) as err:
        typed_config(compose_config(["setting=retrieval", override]))
    assert "\n" not in str(err.value)
