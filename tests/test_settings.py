"""Settings: the oracle filter, the valid task x setting combinations, and summaries."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from cupid_exp.config import DataConfig, SettingConfig
from cupid_exp.data.loading import load_instances
from cupid_exp.data.schema import PriorSession
from cupid_exp.parsing import ParseError, parse_summaries
from cupid_exp.rendering import summary_log
from cupid_exp.settings import ConfigError, context_text, relevant_positions, select_sessions, validate_combination

SAMPLE = load_instances(DataConfig(name="sample", source="sample")).instances


def test_oracle_keeps_exactly_the_two_matching_sessions_in_order() -> None:
    for inst in SAMPLE:
        kept = select_sessions(inst, SettingConfig(name="oracle"))
        assert len(kept) == 2
        positions = relevant_positions(inst)
        assert positions == sorted(positions)
        assert kept == [inst.prior_interactions[p - 1] for p in positions]
        for s in kept:
            assert s.contextual_preference.strip() == inst.current_contextual_preference.strip()


def test_oracle_for_changing_keeps_the_changed_preference_sessions() -> None:
    changing = [i for i in SAMPLE if i.instance_type == "changing"]
    consistent = {i.persona_id: i for i in SAMPLE if i.instance_type == "consistent"}
    for inst in changing:
        kept = select_sessions(inst, SettingConfig(name="oracle"))
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


def test_standard_summary_and_oracle_preference_show_every_session() -> None:
    for name in ("standard", "summary", "oracle_preference"):
        assert select_sessions(SAMPLE[0], SettingConfig(name=name)) == list(SAMPLE[0].prior_interactions)


@pytest.mark.parametrize("task,setting", [("inference", "standard"), ("generation", "oracle_preference"),
                                          ("both", "summary"), ("both", "oracle"), ("generation", "summary")])
def test_valid_combinations_pass(task: str, setting: str) -> None:
    validate_combination(task, setting)


@pytest.mark.parametrize("task", ["inference", "both"])
def test_oracle_preference_is_generation_only(task: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate_combination(task, "oracle_preference")
    message = str(err.value)
    assert "\n" not in message
    assert f"task={task} cannot run with setting=oracle_preference" in message
    assert "task=generation setting=oracle_preference" in message


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
    with pytest.raises(ParseError, match="1 entries for 2 sessions"):
        parse_summaries('{"summaries": [{"context": [], "preferences": []}]}', 2)


def test_summary_is_computed_once_per_instance_and_shared(monkeypatch) -> None:
    calls = []

    async def fake_summarize(ctx, sessions, setting, record):
        calls.append(len(sessions))
        await asyncio.sleep(0)
        return [{"session_id": i + 1, "context": ["c"], "preferences": ["p"]} for i in range(len(sessions))]

    monkeypatch.setattr("cupid_exp.settings._summarize", fake_summarize)

    class Ctx:
        summaries: dict = {}

    class Rec:
        values: dict = {}

    inst = SAMPLE[0]
    sessions: list[PriorSession] = list(inst.prior_interactions)

    async def both_tasks():
        return await asyncio.gather(*(context_text(Ctx, inst, sessions, SettingConfig(name="summary"), Rec)
                                      for _ in range(2)))

    first, second = asyncio.run(both_tasks())
    assert first == second and calls == [8]
