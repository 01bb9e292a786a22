"""Rendering: the byte layout of logs, lists and the matcher's few-shot block."""

from __future__ import annotations

import json

from cupid_exp.data.schema import Message, PriorSession
from cupid_exp.prompts import PromptSet
from cupid_exp.rendering import SCORE_TO_LABEL, bulleted, interaction_log, matcher_examples, numbered


def session(*turns: tuple[str, str]) -> PriorSession:
    return PriorSession(context_factor="f", contextual_preference="p",
                        dialogue=tuple(Message(role=r, content=c) for r, c in turns))


def test_interaction_log_one_session_exact():
    log = interaction_log([session(("user", "Hi"), ("assistant", "Hello"))])
    assert log == "### Session 1\n\n#### User\n\nHi\n\n#### AI Assistant\n\nHello\n\n---"


def test_interaction_log_two_sessions_exact():
    log = interaction_log([
        session(("user", "Hi"), ("assistant", "Hello")),
        session(("user", "Again"), ("assistant", "Sure"), ("user", "Thanks")),
    ])
    assert log == (
        "### Session 1\n\n#### User\n\nHi\n\n#### AI Assistant\n\nHello\n\n---"
        "\n\n### Session 2\n\n#### User\n\nAgain\n\n#### AI Assistant\n\nSure\n\n#### User\n\nThanks\n\n---"
    )
    assert log.count("\n\n---\n\n### Session 2") == 1


def test_interaction_log_never_renders_factor_or_preference():
    s = PriorSession(context_factor="SECRET_FACTOR", contextual_preference="SECRET_PREF",
                     dialogue=(Message("user", "Hi"), Message("assistant", "Hello")))
    log = interaction_log([s])
    assert "SECRET" not in log


def test_interaction_log_numbers_sessions_from_one_in_order():
    log = interaction_log([session(("user", f"msg {i}"), ("assistant", "ok")) for i in range(8)])
    headers = [line for line in log.splitlines() if line.startswith("### Session")]
    assert headers == [f"### Session {i}" for i in range(1, 9)]
    assert log.index("msg 0") < log.index("msg 7")
    assert log.count("\n---") == 8


def test_interaction_log_empty():
    assert interaction_log([]) == ""


def test_numbered_and_bulleted():
    assert numbered(["Is it short?", "Is it polite?", "Is it dated?"]) == \
        "1. Is it short?\n2. Is it polite?\n3. Is it dated?"
    assert bulleted(["Is it short?", "Is it polite?"]) == "- Is it short?\n- Is it polite?"
    assert numbered([]) == "" and bulleted([]) == ""
    assert numbered(iter(["only"])) == "1. only"


def test_score_to_label():
    assert SCORE_TO_LABEL == {1.0: "Fully Covered", 0.5: "Partially Covered", 0.0: "Not Covered"}


EXAMPLES = [
    {"preference": "Pref one.", "checklist": {"Entry A?": 1, "Entry B?": 0.5, "Entry C?": 0}},
    {"preference": "Pref two.", "checklist": {"Entry D?": 0.5}},
]


def test_matcher_examples_block():
    block = matcher_examples(EXAMPLES)
    first_results = {"results": [
        {"index": 1, "entry": "Entry A?", "label": "Fully Covered"},
        {"index": 2, "entry": "Entry B?", "label": "Partially Covered"},
        {"index": 3, "entry": "Entry C?", "label": "Not Covered"},
    ]}
    second_results = {"results": [{"index": 1, "entry": "Entry D?", "label": "Partially Covered"}]}
    assert json.dumps(first_results, indent=2) in block
    assert json.dumps(second_results, indent=2) in block
    assert block.endswith("```\n\n---")
    expected_first = ("#### Preference\n\nPref one.\n\n#### Output\n\n```json\n"
                      + json.dumps(first_results, indent=2) + "\n```\n\n---\n\n")
    assert block.startswith(expected_first)
    assert block == (expected_first + "#### Preference\n\nPref two.\n\n#### Output\n\n```json\n"
                     + json.dumps(second_results, indent=2) + "\n```\n\n---")
    assert "reasoning" not in block  # upstream's rendered examples carry no reasoning field


def test_matcher_examples_from_project_prompts():
    examples = PromptSet().matcher_examples()
    block = matcher_examples(examples)
    assert block.count("#### Preference") == 8
    assert block.count("```json") == 8
    assert block.count("\n---") == 8
    scores = [float(s) for ex in examples for s in ex["checklist"].values()]
    assert len(scores) == 28
    for score, label in SCORE_TO_LABEL.items():
        assert block.count(f'"label": "{label}"') == scores.count(score)


def test_matcher_examples_fill_the_matcher_prompt():
    prompts = PromptSet()
    block = matcher_examples(prompts.matcher_examples())
    msgs = prompts.get("evaluation/preference_matcher").messages(examples=block, preference="P", checklist="1. Q?")
    assert block in msgs[0]["content"]
    assert msgs[1]["content"].startswith("#### Preference\n\nP\n\n#### Checklist\n\n1. Q?")
