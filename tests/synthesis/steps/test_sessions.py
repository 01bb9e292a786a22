"""Session step: a request that leaks its preference is regenerated; the opening message; wrong shapes."""

from __future__ import annotations

import asyncio

import pytest

from cupid_exp.llm.replies import ParseError
from cupid_exp.synthesis.steps import sessions as steps

from ..scripted import WRONG_SHAPES, ScriptedServer, assert_rejected, context, reply

PREF = "Explanations of the budget must use exactly three bullet points with euro amounts."
LEAKY = {"story": "She is planning the ward budget for next quarter today.",
         "request_with_preference": f"Help me plan the budget. {PREF}", "request": f"Help me plan. {PREF}"}
CLEAN = {**LEAKY, "request": "Can you help me plan the ward budget for next quarter?"}


def test_session_that_leaks_its_preference_is_regenerated(tmp_path) -> None:
    with ScriptedServer([reply(LEAKY), reply(CLEAN)]) as server:
        ctx = context(server.url, tmp_path)
        session = asyncio.run(steps.write_session(
            ctx, persona_description="A nurse.", factor={"factor": "Ward budget", "task_types": ["Planning"]},
            preference=PREF, task_type="Planning", session_number=1, n_sessions=13, earlier=[], shift_reason=None))
    assert session["request"] == CLEAN["request"] and session["task_type"] == "Planning"
    assert "reveals the preference" in server.requests[1]["messages"][-1]["content"]


def test_rules() -> None:
    problems = steps.validate_session({**CLEAN, "request": CLEAN["request_with_preference"]}, PREF, False)
    assert any("leave out the preference" in p for p in problems)
    problems = steps.validate_session({**CLEAN, "request": "Please summarise the [resource] for me."}, PREF, False)
    assert any("[resource]" in p for p in problems)
    assert steps.validate_session(CLEAN, PREF, False) == []


def test_resources_fill_the_opening_message() -> None:
    build = steps.build_session(PREF, "Planning", with_resources=True)
    session = build({**CLEAN, "request": "Please check the [resource] for errors.", "resource": "Q3: 12,000 EUR"})
    assert steps.first_message(session) == "Please check the \n\nQ3: 12,000 EUR\n\n for errors."
    assert steps.build_session(PREF, "Planning", with_resources=True)(CLEAN)["resource"] == ""
    with pytest.raises(ParseError, match="resource"):
        build({**CLEAN, "resource": ["not", "text"]})


def test_earlier_scenarios_show_the_last_two() -> None:
    assert "first scenario" in steps.earlier_scenarios([None, None])
    text = steps.earlier_scenarios([{"story": "One."}, None, {"story": "Three."}, {"story": "Four."}])
    assert text == "- Scenario 3: Three.\n- Scenario 4: Four."


@pytest.mark.parametrize("data", [*WRONG_SHAPES, [CLEAN], {**CLEAN, "request": None}, {**CLEAN, "story": 42},
                                  {k: v for k, v in CLEAN.items() if k != "request_with_preference"}])
def test_refuses_wrong_shapes(data) -> None:
    assert_rejected(steps.build_session(PREF, "Planning", with_resources=False), data)
