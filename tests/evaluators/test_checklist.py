"""Checklist parsing and coverage labels: each returns the value or raises ParseError, never a 0."""

from __future__ import annotations

import json

import pytest

from cupid_exp.evaluators.checklist import label_score, parse_checklist, parse_match_labels
from cupid_exp.llm.replies import ParseError


def test_checklist_fenced_with_prose_around():
    reply = (
        "**Analysis**\n\nTwo requirements: figures and one-sentence budget changes.\n\n**Checklist**\n\n"
        '```json\n{\n  "checklist": [\n    "Are outcomes backed by attendance figures?",\n'
        '    "Is each budget change explained in one sentence?"\n  ]\n}\n```\n\nLet me know!'
    )
    assert parse_checklist(reply) == [
        "Are outcomes backed by attendance figures?",
        "Is each budget change explained in one sentence?",
    ]


def test_checklist_bare_object_and_whitespace_trimmed():
    assert parse_checklist('{"checklist": ["  Is it short? ", "Is it polite?"]}') == ["Is it short?",
                                                                                     "Is it polite?"]


def test_checklist_bare_list():
    assert parse_checklist('["Is it short?"]') == ["Is it short?"]


def test_checklist_after_think_block():
    reply = '<think>{"checklist": ["decoy?"]}</think>{"checklist": ["Real?"]}'
    assert parse_checklist(reply) == ["Real?"]


def test_checklist_keeps_every_item_the_evaluator_caps_it():
    reply = json.dumps({"checklist": ["a?", "b?", "c?", "d?", "e?"]})
    assert len(parse_checklist(reply)) == 5  # Evaluator.checklist keeps the first max_checklist_items


@pytest.mark.parametrize("reply", [
    '{"checklist": []}',
    "```json\n{\"checklist\": []}\n```",
    "[]",
])
def test_checklist_empty_list_raises(reply):
    with pytest.raises(ParseError):
        parse_checklist(reply)


@pytest.mark.parametrize("reply", [
    "1. Is it short?\n2. Is it polite?",
    "```json\n{checklist: [Is it short?]}\n```",
    "",
])
def test_checklist_non_json_raises(reply):
    with pytest.raises(ParseError):
        parse_checklist(reply)


@pytest.mark.parametrize("reply", [
    '{"items": ["Is it short?"]}',            # wrong key
    '{"checklist": "Is it short?"}',          # not a list
    '{"checklist": ["Is it short?", ""]}',    # blank entry
    '{"checklist": ["Is it short?", {"q": 1}]}',  # non-text entry
    '{"checklist": ["Is it short?", null]}',
])
def test_checklist_bad_shape_raises(reply):
    with pytest.raises(ParseError):
        parse_checklist(reply)


# ---------------------------------------------------------------- labels


@pytest.mark.parametrize("label,score", [
    ("Fully Covered", 1.0),
    ("fully covered", 1.0),
    ("FULLY  COVERED", 1.0),
    ("Fully-Covered", 1.0),
    (" Fully Covered. ", 1.0),
    ("Partially Covered", 0.5),
    ("Partially_Covered", 0.5),
    ("partially covered", 0.5),
    ("Not Covered", 0.0),
    ("not_covered", 0.0),
    ("Not covered.", 0.0),
    ("Fully", 1.0),
    ("partially", 0.5),
])
def test_label_score_variants(label, score):
    assert label_score(label) == score


@pytest.mark.parametrize("label", ["Mostly Covered", "Covered", "Yes", "", "1", "Fully Covered and more", None])
def test_unknown_label_raises_never_zero(label):
    with pytest.raises(ParseError):
        label_score(label)


def _results(*labels, wrap=True, fence=False):
    items = [{"index": i, "entry": f"Entry {i}?", "reasoning": "r", "label": lab}
             for i, lab in enumerate(labels, start=1)]
    body = json.dumps({"results": items} if wrap else items, indent=2)
    return f"Here you go:\n```json\n{body}\n```\n" if fence else body


def test_match_labels_results_object():
    assert parse_match_labels(_results("Fully Covered", "Partially Covered", "Not Covered"), 3) == [1.0, 0.5, 0.0]


def test_match_labels_fenced_with_prose():
    assert parse_match_labels(_results("Not Covered", "Fully Covered", fence=True), 2) == [0.0, 1.0]


def test_match_labels_bare_array():
    assert parse_match_labels(_results("fully covered", "Partially_Covered", wrap=False), 2) == [1.0, 0.5]


def test_match_labels_bare_array_of_strings():
    assert parse_match_labels('["Not Covered", "Partially Covered"]', 2) == [0.0, 0.5]


def test_match_labels_case_and_spacing_variants():
    reply = _results("fully covered", "Partially_Covered", "NOT  COVERED", "Partially-Covered")
    assert parse_match_labels(reply, 4) == [1.0, 0.5, 0.0, 0.5]


def test_match_labels_after_think_block():
    reply = "<think>" + _results("Not Covered") + "</think>" + _results("Fully Covered")
    assert parse_match_labels(reply, 1) == [1.0]


def test_match_labels_unknown_label_raises():
    with pytest.raises(ParseError, match="Mostly Covered"):
        parse_match_labels(_results("Fully Covered", "Mostly Covered"), 2)


@pytest.mark.parametrize("n_items", [1, 3])
def test_match_labels_wrong_count_raises(n_items):
    with pytest.raises(ParseError, match="2 results"):
        parse_match_labels(_results("Fully Covered", "Not Covered"), n_items)


def test_match_labels_missing_label_raises():
    reply = json.dumps({"results": [{"index": 1, "entry": "a", "label": "Fully Covered"},
                                    {"index": 2, "entry": "b", "reasoning": "no label given"}]})
    with pytest.raises(ParseError, match="result 2"):
        parse_match_labels(reply, 2)


@pytest.mark.parametrize("reply", [
    '{"labels": ["Fully Covered"]}',
    '{"results": "Fully Covered"}',
    "The entry is fully covered.",
])
def test_match_labels_no_results_list_raises(reply):
    with pytest.raises(ParseError):
        parse_match_labels(reply, 1)
