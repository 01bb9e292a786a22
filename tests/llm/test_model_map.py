"""Model ids that exist: every shipped API model config is in litellm's model map (exact id, context window,
prices) or says in a comment why not and carries its own prices (or says it is unpriced); and the plan's one
line per model the map cannot vouch for."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import pytest
import yaml

from cupid_exp.config import LocalModelConfig, ModelConfig, ModelInfo
from cupid_exp.job.checks import note_models
from cupid_exp.llm.model_map import map_entry, model_note

LLM_CONF = Path(__file__).resolve().parents[2] / "conf" / "llm"
REASON = "not in litellm's model map:"


def api_configs() -> list[Path]:
    """Every shipped model config that calls an API (embedded models carry a ``local:`` block)."""
    return sorted(p for p in LLM_CONF.glob("*.yaml") if "local" not in (yaml.safe_load(p.read_text()) or {}))


def comment_lines(text: str) -> list[str]:
    """The YAML file's comments, whole-line or trailing (a '#' inside a quoted value is not one; none here)."""
    return [line.split("#", 1)[1].strip() for line in text.splitlines() if "#" in line]


def map_problems(text: str) -> list[str]:
    """Why a config's id would surprise a user at run time; [] when litellm's map or the config covers it."""
    cfg = yaml.safe_load(text)
    entry = map_entry(cfg["litellm_model"])
    if entry is not None:
        missing = [f for f, v in (("context window", entry.max_input_tokens), ("prices", entry.priced)) if not v]
        return [f"litellm's map entry {entry.key} has no {', '.join(missing)}"] if missing else []
    comments = " ".join(comment_lines(text))
    reason = comments.lower().partition(REASON)[2].strip()
    problems = []
    if len(reason.split()) < 5:
        problems.append(f"{cfg['litellm_model']} is not in litellm's map and no comment says why "
                        f"(a comment '# Not in litellm's model map: <reason>')")
    info = cfg.get("model_info") or {}
    if not (info.get("input_cost_per_token") is not None and info.get("output_cost_per_token") is not None
            or "unpriced" in reason):
        problems.append("neither model_info's input_cost_per_token and output_cost_per_token nor 'unpriced' in the "
                        "reason")
    if not (cfg.get("context_window") or cfg.get("api_base")):
        problems.append("no context_window (only a self-hosted api_base endpoint may leave it to the server)")
    return problems


@pytest.mark.parametrize("path", api_configs(), ids=lambda p: p.stem)
def test_each_shipped_api_model_is_known_to_litellm_or_says_why(path: Path) -> None:
    assert map_problems(path.read_text()) == []


def test_the_shipped_configs_cover_the_papers_api_models() -> None:
    assert {p.stem for p in api_configs()} >= {"gpt4o", "gpt4o_eval", "o3_mini", "claude35", "claude37", "llama405b",
                                                "mistral7b", "qwen72b", "deepseek_r1", "gemini_flash_thinking",
                                                "gemini_pro"}


def test_an_unknown_id_without_a_reason_fails_the_rule() -> None:
    bare = "name: x\nlitellm_model: openai/gpt-4o-2024-08-07\n"
    assert len(map_problems(bare)) == 3
    priced = bare + ("model_info: {input_cost_per_token: 2.5e-06, output_cost_per_token: 1.0e-05}\n"
                     "context_window: 128000\n")
    assert len(map_problems(priced)) == 1  # prices alone are not a reason
    reasoned = "# Not in litellm's model map: a snapshot its provider retired in 2025.\n" + priced
    assert map_problems(reasoned) == []
    unpriced = ("# Not in litellm's model map: a hosted open model the map lacks; unpriced.\n"
                "name: x\nlitellm_model: together_ai/some/model\ncontext_window: 8192\n")
    assert map_problems(unpriced) == []


def test_gpt4o_is_openais_snapshot_not_the_papers_misprint() -> None:
    cfg = yaml.safe_load((LLM_CONF / "gpt4o.yaml").read_text())
    assert cfg["litellm_model"] == "openai/gpt-4o-2024-08-06"
    assert "2024-08-07" in (LLM_CONF / "gpt4o.yaml").read_text()  # the comment says why it differs from Table 8
    # litellm's own lookup answers the misprint with gpt-4o's entry; only the exact id counts as known
    import litellm

    assert litellm.get_model_info(model="gpt-4o-2024-08-07", custom_llm_provider="openai")["key"] == "gpt-4o"
    assert map_entry("openai/gpt-4o-2024-08-07") is None
    entry = map_entry("openai/gpt-4o-2024-08-06")
    assert entry is not None and entry.priced and entry.max_input_tokens == 128000


# ---- the plan's one line per model ----------------------------------------------------------------------

def api(name: str, litellm_model: str, **kw) -> ModelConfig:
    return ModelConfig(name=name, litellm_model=litellm_model, **kw)


TODAY = dt.date(2026, 1, 1)


def test_an_unknown_unpriced_id_is_one_warning_saying_both() -> None:
    level, text = model_note(api("typo", "openai/gpt-4o-2024-08-07"), ["model"], TODAY)
    assert level == "warning" and "\n" not in text
    assert text.startswith("model (typo, openai/gpt-4o-2024-08-07): not in litellm's model map")
    assert "likely misspelt or retired" in text and "unpriced: its cost will read as unknown" in text


def test_an_unknown_id_priced_by_its_config_warns_only_about_the_id() -> None:
    model = api("claude37", "anthropic/claude-3-7-sonnet-20250219", model_info=ModelInfo(input_cost_per_token=3e-6,
                output_cost_per_token=1.5e-5))
    level, text = model_note(model, ["model"], TODAY)
    assert level == "warning" and "likely misspelt or retired" in text and "unpriced" not in text


def test_a_known_priced_id_says_nothing() -> None:
    assert model_note(api("gpt4o", "openai/gpt-4o-2024-08-06"), ["model"], TODAY) is None


def test_a_passed_deprecation_date_from_the_map_is_a_warning() -> None:
    model = api("o3_mini", "openai/o3-mini-2025-01-31")
    assert model_note(model, ["model"], dt.date(2026, 10, 1)) is None
    level, text = model_note(model, ["model"], dt.date(2026, 11, 1))
    assert level == "warning" and "deprecation date as 2026-10-23" in text


def test_embedded_and_self_hosted_models_make_no_warning() -> None:
    embedded = api("local", "llamacpp/smollm2-135m-instruct", local=LocalModelConfig(gguf="x.gguf"))
    assert model_note(embedded, ["model"], TODAY) is None
    priced_server = api("prefmatcher", "hosted_vllm/kixlab/prefmatcher-7b", api_base="http://127.0.0.1:8000/v1",
                        model_info=ModelInfo(input_cost_per_token=0.0, output_cost_per_token=0.0))
    assert model_note(priced_server, ["evaluator.matcher"], TODAY) is None
    level, text = model_note(api("srv", "openai/whatever", api_base="http://127.0.0.1:8000/v1"), ["model"], TODAY)
    assert level == "info" and "self-hosted" in text and "unpriced" in text and "not in litellm's model map" not in text
    # a proxy of a mapped model is priced by the map: nothing to say
    assert model_note(api("gpt4o", "openai/gpt-4o-2024-08-06", api_base="http://127.0.0.1:8000/v1"), ["model"],
                      TODAY) is None


def test_the_plan_notes_each_model_once_for_all_its_roles(caplog: pytest.LogCaptureFixture) -> None:
    judge = api("typo", "openai/gpt-4o-2024-08-07")
    roles = {"model": api("gpt4o", "openai/gpt-4o-2024-08-06"), "evaluator.decomposer": judge,
             "evaluator.matcher": api("typo", "openai/gpt-4o-2024-08-07"),
             "evaluator.judge": api("srv", "openai/stub", api_base="http://127.0.0.1:9/v1")}
    with caplog.at_level(logging.INFO, logger="cupid_exp.job.checks"):
        note_models(roles)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert warnings == [warnings[0]] and warnings[0].startswith("evaluator.decomposer, evaluator.matcher (typo, ")
    assert len(infos) == 1 and infos[0].startswith("evaluator.judge (srv, openai/stub) at http://127.0.0.1:9/v1")
