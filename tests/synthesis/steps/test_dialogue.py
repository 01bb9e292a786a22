"""Dialogue step: user simulator against assistant simulator; a 10 ends it, otherwise the assistant does."""

from __future__ import annotations

import asyncio

import pytest

from cupid_exp.llm.replies import Invalid
from cupid_exp.synthesis.steps import dialogue as steps

from ..scripted import WRONG_SHAPES, ScriptedServer, assert_rejected, context, counts, reply


def sim(score, message: str = "Not quite.", selected=(1,)) -> tuple:
    return reply({"evaluation": "Checked every item.", "score": score, "selected_items": list(selected),
                  "message": message})


def simulate(ctx, **kwargs):
    return asyncio.run(steps.simulate_dialogue(ctx, **{
        "persona_description": "A nurse.", "factor": "Ward budget", "preference": "Short answers.",
        "checklist": ["Is it short?"], "request": "Plan my budget.", **kwargs}))


def test_user_simulator_ends_on_a_ten_with_the_users_closing_message(tmp_path) -> None:
    """A dialogue starts with the user, the simulator sees a user turn first, and a 10 closes it."""
    script = [reply("First answer."), sim(6, "Shorter, please."), reply("Second answer."), sim(10, "Perfect, thanks!")]
    with ScriptedServer(script) as server:
        out = simulate(context(server.url, tmp_path, max_turns=4))
    assert [m["role"] for m in out["dialogue"]] == ["user", "assistant", "user", "assistant", "user"]
    assert out["dialogue"][-1]["content"] == "Perfect, thanks!" and out["is_satisfied"]
    assert out["scores"] == [6, 10] and out["error"] is None
    sim_view = server.requests[1]["messages"]
    assert sim_view[0]["role"] == "system" and sim_view[1]["role"] == "user"  # opened by a user turn
    assert [m["role"] for m in sim_view[1:]] == ["user", "assistant", "user"]


def test_unsatisfied_dialogue_ends_with_the_assistant_and_is_flagged(tmp_path) -> None:
    script = [reply("Answer one."), sim(4, selected=()), reply("Answer two."), sim(4, selected=())]
    with ScriptedServer(script) as server:
        out = simulate(context(server.url, tmp_path, max_turns=2))
    assert [m["role"] for m in out["dialogue"]] == ["user", "assistant", "user", "assistant"]
    assert not out["is_satisfied"] and out["scores"] == [4, 4]
    assert len(server.requests) == 4


def test_a_regenerated_dialogue_is_a_new_conversation_with_a_moved_seed(tmp_path) -> None:
    with ScriptedServer([reply("Answer."), sim(10, "Thanks!")]) as server:
        out = simulate(context(server.url, tmp_path), attempt=2)
    assert out["attempt"] == 2 and out["is_satisfied"]
    assistant, user_sim = server.requests
    assert assistant["seed"] == 2 and "(Conversation 3.)" in assistant["messages"][0]["content"]
    assert "(Conversation 3.)" in user_sim["messages"][0]["content"]


def test_an_empty_assistant_reply_is_counted_and_stands_as_no_answer(tmp_path) -> None:
    with ScriptedServer([reply("   "), sim(10, "Thanks anyway.")]) as server:
        ctx = context(server.url, tmp_path)
        out = simulate(ctx)
    assert out["dialogue"][1]["content"] == steps.NO_ANSWER
    assert counts(ctx, "assistant_simulator")["empty_attempt"] == 1


def test_a_user_simulator_that_never_answers_ends_the_dialogue_with_its_error(tmp_path) -> None:
    with ScriptedServer([reply("An answer."), reply("not json")]) as server:
        ctx = context(server.url, tmp_path, max_retries=1)
        out = simulate(ctx)
    assert out["error"].startswith("user_simulator: unparseable") and out["scores"] == []
    assert [m["role"] for m in out["dialogue"]] == ["user", "assistant"]
    assert counts(ctx, "user_simulator")["gave_up"] == 1


def test_user_turn_rules() -> None:
    build = steps.build_user_turn(3)
    turn = build({"evaluation": "Good.  Mostly.", "score": "8/10", "selected_items": [1, "2", 9, "x"],
                  "message": "Nice."})
    assert turn == {"evaluation": "Good. Mostly.", "score": 8, "selected_items": [1, 2], "message": "Nice."}
    assert build({"evaluation": "Good.", "score": 7.0, "message": "Nice."})["selected_items"] == []
    for score in (0, 11, True, "many", None):
        with pytest.raises(Invalid, match="score"):
            build({"evaluation": "Good.", "score": score, "selected_items": [], "message": "Nice."})


@pytest.mark.parametrize("data", [*WRONG_SHAPES, [{"score": 10}],
                                  {"evaluation": "Good.", "score": 9, "selected_items": 2, "message": "Hi."},
                                  {"evaluation": "Good.", "score": 9, "selected_items": [], "message": 5},
                                  {"evaluation": ["Good."], "score": 9, "selected_items": [], "message": "Hi."},
                                  {"score": 9, "selected_items": [1], "message": "Hi."}])
def test_user_turn_refuses_wrong_shapes(data) -> None:
    assert_rejected(steps.build_user_turn(2), data)
