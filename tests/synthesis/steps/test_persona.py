"""Persona step: the accepted reply shapes, the rules, copied placeholders, and wrong shapes refused."""

from __future__ import annotations

import asyncio

import pytest

from cupid_exp.llm.replies import Invalid
from cupid_exp.synthesis.steps import factors as steps

from ..scripted import WRONG_SHAPES, ScriptedServer, assert_rejected, context, counts, reply

DESCRIPTION = ("Mara Okafor, 41, she/her, is a senior paediatric nurse who plans night rotas for her ward. "
               "She wants calm, well-staffed shifts and worries about burnout among the younger nurses.")
PERSONA = {"occupation": "Paediatric nurse, senior", "description": DESCRIPTION}


@pytest.mark.parametrize("data", [{"personas": [PERSONA]}, [PERSONA], PERSONA])
def test_accepts_the_wrapped_the_listed_and_the_bare_persona(data) -> None:
    assert steps.build_persona(data) == {"description": DESCRIPTION, "occupation": "Paediatric nurse"}


def test_rules() -> None:
    with pytest.raises(Invalid, match="several sentences"):
        steps.build_persona({**PERSONA, "description": "Too short."})
    with pytest.raises(Invalid, match="short job title"):
        steps.build_persona({**PERSONA, "occupation": "one who does many different things at the hospital"})


@pytest.mark.parametrize("data", [*WRONG_SHAPES, {"personas": []}, {"personas": "nurse"}, {"personas": [["nested"]]},
                                  {"personas": [{"occupation": "Nurse"}]}, {**PERSONA, "occupation": 12},
                                  {**PERSONA, "description": ["a", "list"]}])
def test_refuses_wrong_shapes(data) -> None:
    assert_rejected(steps.build_persona, data)


def test_a_copied_placeholder_is_asked_again(tmp_path) -> None:
    copied = {"personas": [{"occupation": "<job title>", "description": DESCRIPTION}]}
    with ScriptedServer([reply(copied), reply({"personas": [PERSONA]})]) as server:
        ctx = context(server.url, tmp_path)
        persona = asyncio.run(steps.write_persona(ctx, "1. Seed: a nurse."))
    assert persona["occupation"] == "Paediatric nurse"
    assert "template placeholders" in server.requests[1]["messages"][-1]["content"]
    assert "<" not in server.requests[1]["messages"][-1]["content"].split("Attempt 2")[1]  # the bait is not quoted
    assert counts(ctx, "persona")["invalid_attempt"] == 1
