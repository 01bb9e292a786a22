"""Prompt files: every template formats into [system, user]; drop-in directories override per file."""

from __future__ import annotations

import shutil
import string
from pathlib import Path

import pytest
import yaml

from cupid_exp.config import ConfigError
from cupid_exp.prompts import EVALUATION_PROMPTS, MATCHER_EXAMPLES, PROJECT_PROMPTS, PromptSet, PromptTemplate

# The evaluation prompts (synthesis prompts are tested with the synthesis package).
PROMPT_FILES = sorted(
    p.relative_to(PROJECT_PROMPTS).with_suffix("").as_posix()
    for p in PROJECT_PROMPTS.rglob("*.yaml")
    if p.relative_to(PROJECT_PROMPTS).as_posix() != MATCHER_EXAMPLES
    and p.relative_to(PROJECT_PROMPTS).as_posix().startswith(EVALUATION_PROMPTS)
)

# The placeholders each step fills (cupid_exp/tasks and the protocol spec); written out by hand.
EXPECTED_PLACEHOLDERS = {
    "evaluation/preference_inferrer": {"interaction_log", "curr_request"},
    "evaluation/preference_matcher": {"examples", "preference", "checklist"},
    "evaluation/preference_matcher_model": {"preference", "checklist"},
    "evaluation/response_generator": {"interaction_log", "curr_request"},
    "evaluation/response_generator_oracle_preference": {"preference", "curr_request"},
    "evaluation/response_generator_oracle_preference_log": {"interaction_log", "preference", "curr_request"},
    "evaluation/response_judger": {"preference", "checklist", "user_request", "ai_response"},
    "evaluation/session_summarizer": {"interaction_log"},
    "synthesis/preference_decomposer": {"preferences"},
}


def placeholders(template: str | None) -> set[str]:
    if template is None:
        return set()
    return {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}


def test_every_prompt_file_is_known():
    assert set(PROMPT_FILES) == set(EXPECTED_PLACEHOLDERS)


@pytest.mark.parametrize("name", PROMPT_FILES)
def test_prompt_loads_and_formats_into_system_and_user(name):
    tpl = PromptSet().get(name)
    assert isinstance(tpl, PromptTemplate) and tpl.name == name
    assert tpl.system and tpl.user
    fields = placeholders(tpl.system) | placeholders(tpl.user)
    assert fields == EXPECTED_PLACEHOLDERS[name]
    values = {f: f"<<VALUE OF {f}>>" for f in fields}
    msgs = tpl.messages(**values)
    assert [m["role"] for m in msgs] == ["system", "user"]
    text = msgs[0]["content"] + msgs[1]["content"]
    for f, v in values.items():
        assert v in text, f
        assert "{" + f + "}" not in text
    # escaped braces ({{ }}) come out single; no doubled braces survive formatting
    assert "{{" not in text and "}}" not in text


def test_json_format_examples_survive_formatting():
    msgs = PromptSet().get("evaluation/preference_matcher").messages(examples="E", preference="P", checklist="C")
    assert '```json\n{\n  "results": [\n    {\n      "index": 1,' in msgs[0]["content"]
    dec = PromptSet().get("synthesis/preference_decomposer").messages(preferences="P")
    assert '```json\n{\n  "checklist": [' in dec[0]["content"]
    assert dec[1]["content"].endswith("P")


def test_inferrer_asks_for_the_headers_the_parser_reads():
    user = PromptSet().get("evaluation/preference_inferrer").user
    assert "### Analysis" in user
    assert "### Most Likely Preference" in user
    assert user.index("{interaction_log}") < user.index("{curr_request}")


def test_system_role_is_configurable():
    msgs = PromptSet().get("evaluation/session_summarizer").messages("developer", interaction_log="L")
    assert msgs[0]["role"] == "developer" and msgs[1]["role"] == "user"


def test_extra_values_are_ignored():
    msgs = PromptSet().get("evaluation/preference_matcher_model").messages(
        preference="P", checklist="C", examples="unused")
    assert "unused" not in msgs[0]["content"] + msgs[1]["content"]


def test_missing_placeholder_raises_key_error_naming_it():
    tpl = PromptSet().get("evaluation/preference_inferrer")
    with pytest.raises(KeyError) as info:
        tpl.messages(interaction_log="log only")
    assert "curr_request" in str(info.value)
    assert "evaluation/preference_inferrer" in str(info.value)


def test_missing_placeholder_in_system_prompt_raises():
    tpl = PromptTemplate("t", system="S {needed}", user="U {given}")
    with pytest.raises(KeyError, match="needed"):
        tpl.messages(given="x")


def test_the_system_text_can_be_sent_as_written():
    """The official tool formats only the user prompt of the evaluated model's steps."""
    tpl = PromptTemplate("t", system="Keep {this} and {{that}}", user="U {x}")
    assert tpl.messages(format_system=False, x="1")[0]["content"] == "Keep {this} and {{that}}"
    assert tpl.messages(x="1", this="it")[0]["content"] == "Keep it and {that}"


def test_template_without_system_gives_user_only():
    assert PromptTemplate("t", system=None, user="U {x}").messages(x="1") == [{"role": "user", "content": "U 1"}]


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")


def test_a_drop_in_is_taken_whole_and_never_falls_back_to_ours(tmp_path):
    """A user who gives a prompt folder wants every call as its files make it: a file it lacks is an error
    naming it, never the project's file of the same name."""
    _write(tmp_path / "evaluation" / "preference_inferrer.yaml",
           {"system_prompt": "DROP-IN SYSTEM", "user_prompt": "LOG={interaction_log} REQ={curr_request}"})
    drop = PromptSet(tmp_path)
    assert drop.directory == tmp_path.resolve()
    msgs = drop.get("evaluation/preference_inferrer").messages(interaction_log="L", curr_request="R")
    assert msgs == [{"role": "system", "content": "DROP-IN SYSTEM"}, {"role": "user", "content": "LOG=L REQ=R"}]
    for name in ("evaluation/preference_matcher", "synthesis/preference_decomposer"):
        assert (PROJECT_PROMPTS / f"{name}.yaml").is_file()  # ours exists, and is not taken
        with pytest.raises(FileNotFoundError, match=f"has no {name}.yaml"):
            drop.get(name)
    assert drop.missing(["evaluation/preference_inferrer", "evaluation/preference_matcher"]) == [
        "evaluation/preference_matcher.yaml"]
    # ... nor the matcher's few-shot examples: a drop-in brings its own or the official module's
    with pytest.raises(ConfigError, match="no matcher few-shot examples") as err:
        drop.matcher_examples()
    assert "\n" not in str(err.value)


def test_drop_in_with_only_user_prompt(tmp_path):
    _write(tmp_path / "evaluation" / "response_generator.yaml", {"user_prompt": "{curr_request}"})
    msgs = PromptSet(tmp_path).get("evaluation/response_generator").messages(curr_request="R", interaction_log="")
    assert msgs == [{"role": "user", "content": "R"}]


def test_drop_in_file_without_prompt_keys_raises(tmp_path):
    _write(tmp_path / "evaluation" / "response_judger.yaml", {"prompt": "x"})
    with pytest.raises(ValueError, match="system_prompt"):
        PromptSet(tmp_path).get("evaluation/response_judger")


def test_digest_changes_only_when_a_file_in_effect_differs(tmp_path):
    base = PromptSet().digest()
    assert base == PromptSet().digest()
    assert len(base) == 16
    same = tmp_path / "same"
    target = same / "evaluation" / "preference_matcher.yaml"
    target.parent.mkdir(parents=True)
    shutil.copy(PROJECT_PROMPTS / "evaluation" / "preference_matcher.yaml", target)
    shutil.copy(PROJECT_PROMPTS / MATCHER_EXAMPLES, same / MATCHER_EXAMPLES)
    assert PromptSet(same).digest() == base  # byte-identical drop-in: same prompts in effect
    changed = tmp_path / "changed"
    shutil.copytree(same, changed)
    path = changed / "evaluation" / "preference_matcher.yaml"
    path.write_text(path.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    assert PromptSet(changed).digest() != base


def test_digest_changes_when_examples_are_overridden(tmp_path):
    _write(tmp_path / MATCHER_EXAMPLES, {"examples": [{"preference": "p", "checklist": {"q?": 1}}]})
    drop = PromptSet(tmp_path)
    assert drop.digest() != PromptSet().digest()
    assert drop.matcher_examples() == [{"preference": "p", "checklist": {"q?": 1}}]


def test_missing_prompts_dir_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        PromptSet(tmp_path / "nope")


def test_matcher_examples_returns_eight():
    examples = PromptSet().matcher_examples()
    assert len(examples) == 8
    for ex in examples:
        assert isinstance(ex["preference"], str) and ex["preference"].strip()
        assert 3 <= len(ex["checklist"]) <= 4
        assert set(float(s) for s in ex["checklist"].values()) <= {0.0, 0.5, 1.0}
