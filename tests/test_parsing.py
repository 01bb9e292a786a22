"""Reply parsers: each returns the value or raises ParseError, and never guesses a score."""

from __future__ import annotations

import json

import pytest

from cupid_exp.parsing import (
    ParseError,
    label_score,
    parse_checklist,
    parse_json_reply,
    parse_match_labels,
    parse_preference,
    strip_thinking,
)

PREF = "When drafting grant reports, the user wants outcomes backed by attendance figures."

# ---------------------------------------------------------------- strip_thinking


def test_strip_thinking_removes_blocks_of_each_tag():
    assert strip_thinking("<think>hmm\nmore</think>\nAnswer") == "Answer"
    assert strip_thinking("<thinking>x</thinking>A<reasoning>y</reasoning>B") == "AB"
    assert strip_thinking("<THINK>x</Think> Answer ") == "Answer"


def test_strip_thinking_unterminated_leading_block():
    # the chat template ate the opening tag: everything up to '</think>' is reasoning
    assert strip_thinking("I should consider the log...\n</think>\n\nFinal answer") == "Final answer"


def test_strip_thinking_keeps_plain_text_and_handles_none():
    assert strip_thinking("  no reasoning here \n") == "no reasoning here"
    assert strip_thinking(None) == ""
    assert strip_thinking("") == ""


def test_strip_thinking_mismatched_tags_are_not_paired():
    # <think> ... </thinking> is not a block; only the text outside a matched pair survives
    text = "<think>a</thinking> keep"
    assert strip_thinking(text) == text


# ---------------------------------------------------------------- parse_preference


def test_plain_header_then_next_line():
    reply = f"### Analysis\n\nSessions 2 and 5 match.\n\n### Most Likely Preference\n\n{PREF}\n"
    assert parse_preference(reply) == PREF


def test_takes_only_first_line_after_header():
    reply = f"### Most Likely Preference\n{PREF}\nA second line that is not part of the answer."
    assert parse_preference(reply) == PREF


def test_bold_plural_header_same_line():
    reply = f"**Analysis:** the user cares about data.\n\n**Most Likely Preferences:** {PREF}"
    assert parse_preference(reply) == PREF


def test_bold_header_with_colon_inside_and_answer_below():
    reply = f"**Most Likely Preference:**\n\n- {PREF}\n"
    assert parse_preference(reply) == PREF


def test_misspelt_plural_header():
    reply = f"### Analysis\nblah\n\n### Most Likely Preferneces\n{PREF}"
    assert parse_preference(reply) == PREF


def test_lowercase_header_without_hashes():
    assert parse_preference(f"most likely preference: {PREF}") == PREF


def test_think_block_with_decoy_header_is_ignored():
    reply = (
        "<think>\nDraft:\n### Most Likely Preference\nThe user wants emojis everywhere.\n</think>\n"
        f"### Analysis\nSession 3 is relevant.\n\n### Most Likely Preference\n{PREF}"
    )
    assert parse_preference(reply) == PREF


def test_json_reply():
    reply = json.dumps({"analysis": "Session 4 shows it.", "preference": PREF})
    assert parse_preference(reply) == PREF


def test_fenced_json_reply_with_alternative_key():
    reply = "```json\n" + json.dumps({"analysis": "x", "most_likely_preference": f'"{PREF}"'}) + "\n```"
    assert parse_preference(reply) == PREF


def test_json_reply_inside_think_wrapper():
    reply = "<think>ok</think>" + json.dumps({"analysis": "a", "preference": PREF})
    assert parse_preference(reply) == PREF


@pytest.mark.parametrize("quoted", [f'"{PREF}"', f"'{PREF}'", f"“{PREF}”", f"**{PREF}**", f'**"{PREF}"**'])
def test_surrounding_quotes_and_bold_stripped(quoted):
    assert parse_preference(f"### Most Likely Preference\n\n{quoted}\n") == PREF


def test_inner_quotes_survive():
    pref = 'The user wants the word "draft" in every subject line.'
    assert parse_preference(f"### Most Likely Preference\n{pref}") == pref


@pytest.mark.parametrize("reply", [
    f"### Analysis\n{PREF}",
    "I think the user likes short answers.",
    "",
    "<think>### Most Likely Preference\nhidden</think>Nothing here.",
])
def test_missing_header_raises(reply):
    with pytest.raises(ParseError, match="Most Likely Preference"):
        parse_preference(reply)


@pytest.mark.parametrize("reply", [
    "### Analysis\nsomething\n\n### Most Likely Preference\n",
    "### Most Likely Preference\n\n   \n",
    "### Most Likely Preference\n\n### Notes\nThis is not the preference.",
    "**Most Likely Preference:**\n\n**Confidence:**\nhigh",
    "### Most Likely Preference\n\n**Notes**\nThis is not the preference.",
    '### Most Likely Preference\n""\n',
])
def test_empty_section_raises(reply):
    with pytest.raises(ParseError, match="empty"):
        parse_preference(reply)


def test_json_without_preference_falls_back_to_header_search_and_fails():
    with pytest.raises(ParseError):
        parse_preference(json.dumps({"analysis": "only analysis", "preference": "  "}))


# ---------------------------------------------------------------- parse_json_reply / parse_checklist


def test_parse_json_reply_variants():
    assert parse_json_reply('{"a": 1}') == {"a": 1}
    assert parse_json_reply('Sure:\n```json\n{"a": 2}\n```\nDone.') == {"a": 2}
    assert parse_json_reply('Sure:\n```\n{"a": 3}\n```') == {"a": 3}
    assert parse_json_reply('Prose before {"a": 4} and after.') == {"a": 4}
    assert parse_json_reply("[1, 2]") == [1, 2]
    with pytest.raises(ParseError):
        parse_json_reply("no json at all")


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


def test_checklist_max_items_truncates():
    reply = json.dumps({"checklist": ["a?", "b?", "c?", "d?", "e?"]})
    assert parse_checklist(reply, max_items=4) == ["a?", "b?", "c?", "d?"]
    assert len(parse_checklist(reply)) == 5


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
