"""Validation failures trigger regeneration with a changed prompt; bad output is counted, never silent.

The model is a scripted OpenAI-compatible server on 127.0.0.1 that injects bad artefacts.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from cupid_exp.config import ModelConfig, RuntimeConfig
from cupid_exp.llm.client import LLMClient, configure_litellm
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.prompts import PromptSet
from cupid_exp.synthesis import steps
from cupid_exp.synthesis.config import ROLES
from cupid_exp.synthesis.journey import plan_factors

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "llm"))  # the scripted fault server
from fault_server import ScriptedServer, completion_body  # noqa: E402


def factor(name: str, pref: str) -> dict:
    return {"background": "Something that happens in this person's life often.", "factor": name, "preference": pref}


PLAN = plan_factors(0, 1)


def factor_reply(name: str, i: int) -> tuple:
    return (200, completion_body(json.dumps(factor(name, f"Answers about {name} must follow rule number {i} exactly."))),
            {})


PAIR_PREFS = ("Replies for this client must be formal and long, with full citations.",
              "Replies for that client must be casual bullet points with no citations.")


def pair_reply(a: str, b: str) -> tuple:
    pair = [factor(n, p) for n, p in zip((a, b), PAIR_PREFS)]
    return (200, completion_body(json.dumps({"factors": pair})), {})


def factor_script(names: list[str]) -> list[tuple]:
    """Six ordinary factors, then the two members of the contrastive pair, one reply each."""
    return [factor_reply(n, i) for i, n in enumerate(names[:6])] + [
        (200, completion_body(json.dumps(factor(n, p))), {}) for n, p in zip(names[6:], PAIR_PREFS)]


GOOD = [f"Specific thing {c}" for c in "ABCDEFGH"]
DUPLICATE = ["Same name"] * 8


def context(server_url: str, tmp_path, max_retries: int = 2) -> steps.SynthContext:
    runtime = RuntimeConfig(cache_dir=str(tmp_path / "cache"), cache=True, num_retries=0, timeout=10)
    configure_litellm(runtime)
    model = ModelConfig(name="scripted", litellm_model="openai/scripted", api_base=server_url,
                        params={"temperature": 0.7})
    client = LLMClient(model, runtime, UsageMeter())
    return steps.SynthContext(clients={r: client for r in ROLES}, prompts=PromptSet(), max_retries=max_retries)


def test_invalid_factor_is_regenerated_with_a_changed_prompt(tmp_path) -> None:
    """Factor 3 repeats factor 1's name: only factor 3 is asked again, with the reason and attempt number."""
    script = factor_script(GOOD)
    script.insert(2, factor_reply(GOOD[0], 0))
    with ScriptedServer(script) as server:
        ctx = context(server.url, tmp_path)
        saved = []
        factors = asyncio.run(steps.write_factors(ctx, "A nurse.", PLAN, on_factor=lambda fs: saved.append(len(fs))))
    assert [f["factor"] for f in factors] == GOOD
    assert factors[6]["related_factor"] == GOOD[7] and factors[7]["related_factor"] == GOOD[6]
    assert [f["factor_type"] for f in factors] == [p["factor_type"] for p in PLAN]  # types come from code
    assert factors[6]["factor_type"] == factors[7]["factor_type"]
    assert len({f["factor_type"] for f in factors}) == 7
    assert all(f["related_factor"] == "N/A" for f in factors[:6])
    assert len(server.requests) == 9 and saved == [1, 2, 3, 4, 5, 6, 7]
    assert GOOD[6] not in server.requests[-1]["messages"][-1]["content"]  # the pair's name is not shown (copy bait)
    assert PAIR_PREFS[0] in server.requests[-1]["messages"][-1]["content"]  # its preference is, to contradict
    first, second = (r["messages"][-1]["content"] for r in server.requests[2:4])
    assert "Attempt" not in first
    assert "Attempt 2" in second and "names must all be different" in second  # so the cache key differs
    assert ctx.failures["factors"] == {"invalid_attempt": 1}


def test_factors_resume_from_a_partial_list(tmp_path) -> None:
    done = [steps.build_factor([], "f", PLAN[i])(json.loads(factor_reply(n, i)[1]["choices"][0]["message"]["content"]))
            for i, n in enumerate(GOOD[:4])]
    with ScriptedServer(factor_script(GOOD)[4:]) as server:
        factors = asyncio.run(steps.write_factors(context(server.url, tmp_path), "A nurse.", PLAN, done=done))
    assert [f["factor"] for f in factors] == GOOD and len(server.requests) == 4


def test_regeneration_stops_after_max_retries_and_is_counted(tmp_path) -> None:
    with ScriptedServer([(200, completion_body("no json here"), {})]) as server:
        ctx = context(server.url, tmp_path, max_retries=1)
        with pytest.raises(steps.StepFailed) as err:
            asyncio.run(steps.write_factors(ctx, "A nurse.", PLAN))
    assert len(server.requests) == 2
    assert err.value.kind == "unparseable"
    assert ctx.failures["factors"] == {"unparseable_attempt": 2, "gave_up": 1}


def test_session_that_leaks_its_preference_is_regenerated(tmp_path) -> None:
    pref = "Explanations of the budget must use exactly three bullet points with euro amounts."
    leaky = {"story": "She is planning the ward budget for next quarter today.",
             "request_with_preference": f"Help me plan the budget. {pref}", "request": f"Help me plan. {pref}"}
    clean = {**leaky, "request": "Can you help me plan the ward budget for next quarter?"}
    script = [(200, completion_body(json.dumps(leaky)), {}), (200, completion_body(json.dumps(clean)), {})]
    with ScriptedServer(script) as server:
        ctx = context(server.url, tmp_path)
        session = asyncio.run(steps.write_session(
            ctx, persona_description="A nurse.", factor={"factor": "Ward budget", "task_types": ["Planning"]},
            preference=pref, task_type="Planning", session_number=1, n_sessions=13, earlier=[], shift_reason=None))
    assert session["request"] == clean["request"]
    assert "reveals the preference" in server.requests[1]["messages"][-1]["content"]


def test_user_simulator_ends_on_a_ten_with_the_users_closing_message(tmp_path) -> None:
    """A dialogue starts with the user, the simulator sees a user turn first, and a 10 closes it."""
    def sim(score: int, message: str) -> tuple:
        return (200, completion_body(json.dumps({"evaluation": "Checked every item.", "score": score,
                                                 "selected_items": [1], "message": message})), {})

    script = [(200, completion_body("First answer."), {}), sim(6, "Shorter, please."),
              (200, completion_body("Second answer."), {}), sim(10, "Perfect, thanks!")]
    with ScriptedServer(script) as server:
        ctx = context(server.url, tmp_path)
        ctx.max_turns = 4
        out = asyncio.run(steps.simulate_dialogue(ctx, persona_description="A nurse.", factor="Ward budget",
                                                  preference="Short answers.", checklist=["Is it short?"],
                                                  request="Plan my budget."))
    assert [m["role"] for m in out["dialogue"]] == ["user", "assistant", "user", "assistant", "user"]
    assert out["dialogue"][-1]["content"] == "Perfect, thanks!" and out["is_satisfied"]
    assert out["scores"] == [6, 10]
    sim_view = server.requests[1]["messages"]
    assert sim_view[0]["role"] == "system" and sim_view[1]["role"] == "user"  # opened by a user turn
    assert [m["role"] for m in sim_view[1:]] == ["user", "assistant", "user"]


def test_unsatisfied_dialogue_ends_with_the_assistant_and_is_flagged(tmp_path) -> None:
    sim = (200, completion_body(json.dumps({"evaluation": "Misses it.", "score": 4, "selected_items": [],
                                            "message": "Not quite."})), {})
    script = [(200, completion_body("Answer one."), {}), sim, (200, completion_body("Answer two."), {}), sim]
    with ScriptedServer(script) as server:
        ctx = context(server.url, tmp_path)
        ctx.max_turns = 2
        out = asyncio.run(steps.simulate_dialogue(ctx, persona_description="A nurse.", factor="F",
                                                  preference="P.", checklist=["Q?"], request="R."))
    assert [m["role"] for m in out["dialogue"]] == ["user", "assistant", "user", "assistant"]
    assert not out["is_satisfied"] and out["scores"] == [4, 4]
    assert len(server.requests) == 4


def test_factor_rules() -> None:
    good = []
    for i, n in enumerate(GOOD[:6]):
        reply = json.loads(factor_reply(n, i)[1]["choices"][0]["message"]["content"])
        good.append(steps.build_factor(good, "f", PLAN[i])(reply))
    a, b = json.loads(pair_reply(GOOD[6], GOOD[7])[1]["choices"][0]["message"]["content"])["factors"]
    first = steps.build_factor(good, "f", PLAN[6])(a)
    second = steps.build_second(good, first, PLAN[7])(b)
    good += [dict(first, related_factor=second["factor"]), second]
    assert steps.validate_factors(good) == []
    broken = [dict(f) for f in good]
    broken[7]["related_factor"] = "N/A"
    broken[6]["factor_type"] = "Location/Place"
    problems = steps.validate_factors(broken)
    assert any("share one factor type" in p for p in problems)
    assert any("name each other" in p for p in problems)
    assert steps.validate_factors(good[:7]) == ["there must be exactly 8 context factors, got 7"]
    with pytest.raises(steps.Invalid, match="specific name"):
        steps.build_factor([], "f", PLAN[0])(factor("...", "A long enough preference sentence here."))
