"""What each setting shows the model: the oracle filter, the oracle preference, the summaries."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from cupid_exp.config import DataConfig
from cupid_exp.data.loading import SAMPLE_FULL_PATH, load_instances
from cupid_exp.data.schema import relevant_positions
from cupid_exp.llm.replies import ParseError
from cupid_exp.llm.steps import Transcript
from cupid_exp.rendering import interaction_log, summary_log
from cupid_exp.settings import make_setting
from cupid_exp.settings.oracle import OracleConfig
from cupid_exp.settings.oracle_preference import OraclePreferenceConfig
from cupid_exp.settings.standard import StandardConfig
from cupid_exp.settings.summary import parse_summaries

SAMPLE = load_instances(DataConfig(name="local", source="local", path=str(SAMPLE_FULL_PATH))).instances  # 9 rows


def view(config, instance, ctx=None):
    return asyncio.run(make_setting(config).view(instance, ctx, Transcript()))


def test_oracle_keeps_exactly_the_two_matching_sessions_in_order() -> None:
    for inst in SAMPLE:
        shown = view(OracleConfig(), inst)
        positions = relevant_positions(inst)
        assert shown.positions == positions == sorted(positions) and len(positions) == 2
        kept = [inst.prior_interactions[p - 1] for p in positions]
        assert shown.log_text == interaction_log(kept)
        for s in kept:
            assert s.contextual_preference.strip() == inst.current_contextual_preference.strip()
        assert shown.output.data_warnings is None


def test_oracle_for_changing_keeps_the_changed_preference_sessions() -> None:
    consistent = {i.persona_id: i for i in SAMPLE if i.instance_type == "consistent"}
    for inst in (i for i in SAMPLE if i.instance_type == "changing"):
        kept = [inst.prior_interactions[p - 1] for p in view(OracleConfig(), inst).positions]
        assert all(s.contextual_preference != consistent[inst.persona_id].current_contextual_preference
                   for s in kept)


def test_oracle_match_ignores_whitespace_and_a_trailing_period() -> None:
    inst = SAMPLE[0]
    first = inst.prior_interactions[relevant_positions(inst)[0] - 1]
    noisy = replace(first, contextual_preference="  " + first.contextual_preference.rstrip(".") + " \n",
                    context_factor=first.context_factor + ".")
    priors = list(inst.prior_interactions)
    priors[relevant_positions(inst)[0] - 1] = noisy
    assert relevant_positions(replace(inst, prior_interactions=tuple(priors))) == relevant_positions(inst)


def test_an_unexpected_oracle_count_is_a_warning_on_the_instance() -> None:
    shown = view(OracleConfig(expected_oracle_sessions=3), SAMPLE[0])
    assert shown.output.data_warnings == ["oracle kept 2 sessions, expected 3"]


def test_standard_and_oracle_preference_show_every_session() -> None:
    inst = SAMPLE[0]
    full = interaction_log(inst.prior_interactions)
    assert view(StandardConfig(), inst).log_text == full
    oracle_pref = view(OraclePreferenceConfig(), inst)
    assert oracle_pref.positions == list(range(1, 9))
    assert oracle_pref.generation_prompt == "evaluation/response_generator_oracle_preference"
    assert oracle_pref.generation_values == {"preference": inst.current_contextual_preference}
    assert view(OraclePreferenceConfig(include_log=True), inst).generation_prompt.endswith("_log")


def test_summary_parsing_and_rendering() -> None:
    reply = ('```json\n{"summaries": [{"session_id": 1, "analysis": "a", "context": ["planning a trip"], '
             '"preferences": ["short lists", "no jargon"]}, {"session_id": 2, "analysis": "b", '
             '"context": "a single string", "preferences": []}]}\n```')
    summaries = parse_summaries(reply, 2)
    assert summaries[1]["context"] == ["a single string"]
    text = summary_log(summaries)
    assert text == ("### Session 1\n\n#### Context\n\n- planning a trip\n\n#### Preferences\n\n- short lists\n"
                    "- no jargon\n\n---\n\n### Session 2\n\n#### Context\n\n- a single string\n\n"
                    "#### Preferences\n\n- (none)\n\n---")
    assert "analysis" not in text
    with pytest.raises(ParseError, match="1 summaries for 2 sessions"):
        parse_summaries('{"summaries": [{"context": [], "preferences": []}]}', 2)
    with pytest.raises(ParseError, match="lacks 'context'"):
        parse_summaries('{"summaries": [["not", "an", "object"]]}', 1)
