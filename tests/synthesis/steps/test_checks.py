"""The text heuristics and the reply helpers every synthesis step uses."""

from __future__ import annotations

import asyncio

import pytest

from cupid_exp.llm.replies import Invalid, ParseError
from cupid_exp.synthesis.steps.base import as_object, reply_json, text
from cupid_exp.synthesis.steps.checks import (
    contains_text,
    content_words,
    looks_english,
    name_key,
    overlap,
    placeholders,
    same_text,
)

from ..scripted import ScriptedServer, context, counts, reply


def test_overlap_counts_content_words_of_the_part() -> None:
    assert content_words("The user wants SHORT answers, always.") == {"user", "wants", "short", "answers"}
    assert overlap("short answers", "Give short answers please") == 1.0
    assert overlap("short answers with tables", "short") == pytest.approx(1 / 3)
    assert overlap("the and of", "anything") == 0.0


def test_names_and_texts_compare_loosely() -> None:
    assert name_key("The team,") == name_key("the  team;")
    assert same_text("Use tables.", "use   tables") and not same_text("Use tables.", "Use lists.")
    assert contains_text("Please, use tables for this.", "use tables.")


def test_placeholders_anywhere_in_the_reply() -> None:
    assert placeholders({"a": ["fine", "<one sentence>"], "b": {"c": "..."}}) == ["<one sentence>", "..."]
    assert placeholders({"a": "x < y and y > z", "n": 3}) == []
    with pytest.raises(Invalid, match="placeholders"):
        reply_json('{"occupation": "<job title>"}')
    assert reply_json('Sure:\n```json\n{"a": "line one\nline two"}\n```') == {"a": "line one\nline two"}
    with pytest.raises(ParseError):
        reply_json("no json at all")


def test_shape_helpers_raise_parse_errors() -> None:
    assert text({"a": "  two   words "}, "a", "x") == "two words"
    for data in ({}, {"a": None}, {"a": 3}, {"a": "   "}, {"a": ["list"]}):
        with pytest.raises(ParseError):
            text(data, "a", "x")
    for value in ([], "s", None, 1):
        with pytest.raises(ParseError, match="JSON object"):
            as_object(value, "thing")


def test_a_bug_in_a_builder_propagates_and_is_not_counted(tmp_path) -> None:
    """Only ParseError/Invalid are re-asked and counted; a TypeError from a builder stops the step at once."""
    def buggy(data):
        return data["key"] + 1  # a str + int: a bug, not the model's fault

    with ScriptedServer([reply({"key": "text"})]) as server:
        ctx = context(server.url, tmp_path)
        with pytest.raises(TypeError):
            asyncio.run(ctx.ask_json("persona_writer", "persona", [{"role": "user", "content": "hi"}], {}, buggy))
    assert len(server.requests) == 1
    assert counts(ctx, "persona") == {**counts(ctx, "persona"), "calls": 1}
    assert not any(k.endswith("_attempt") or k == "gave_up" for k in counts(ctx, "persona"))


@pytest.mark.parametrize("text, english", [
    ("Prefers concise bullet summaries with the numbers up front.", True),
    ("problem-solving, creative thinking", True),  # too short to judge: let it through
    ("Quiere recetas cortas con los pasos numerados para la cocina", False),
    ("Je veuille votre je ne pas demander à nous pourrions voir les décennons de la cuisine.", False),
    ("Wants café menus priced in euros, with the résumé of each dish.", True),  # a few accents are English too
])
def test_looks_english_refuses_a_reply_in_another_language(text: str, english: bool) -> None:
    assert looks_english(text) is english
