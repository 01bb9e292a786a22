"""The inference step's parser: the stated preference, or a ParseError; never a guess."""

from __future__ import annotations

import json

import pytest

from cupid_exp.llm.replies import ParseError
from cupid_exp.tasks.inference import parse_preference

PREF = "When drafting grant reports, the user wants outcomes backed by attendance figures."


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




@pytest.mark.parametrize("short", ["Concise bullet points only", "Formal tone, no emojis", "**Cite two sources**"])
def test_a_short_bolded_preference_is_the_answer_not_a_header(short):
    reply = f"### Analysis\nSessions 2 and 6 matter.\n\n### Most Likely Preference\n\n**{short.strip('*')}**\n"
    assert parse_preference(reply) == short.strip("*")


def test_an_analysis_line_starting_with_the_header_words_is_not_the_answer():
    reply = (f"### Most Likely Preference\n{PREF}\n\n### Analysis\n"
             "Most likely preference follows session 3, where the user corrected the format.\n")
    assert parse_preference(reply) == PREF
    reply = ("Most likely preference is the one from session 3, since the request names the same client.\n\n"
             f"### Most Likely Preference\n\n{PREF}")
    assert parse_preference(reply) == PREF
