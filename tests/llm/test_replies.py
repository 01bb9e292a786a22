"""Shared reply handling: thinking blocks and JSON extraction."""

from __future__ import annotations

import pytest

from cupid_exp.llm.replies import ParseError, parse_json_reply, strip_thinking

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


def test_parse_json_reply_variants():
    assert parse_json_reply('{"a": 1}') == {"a": 1}
    assert parse_json_reply('Sure:\n```json\n{"a": 2}\n```\nDone.') == {"a": 2}
    assert parse_json_reply('Sure:\n```\n{"a": 3}\n```') == {"a": 3}
    assert parse_json_reply('Prose before {"a": 4} and after.') == {"a": 4}
    assert parse_json_reply("[1, 2]") == [1, 2]
    with pytest.raises(ParseError):
        parse_json_reply("no json at all")


