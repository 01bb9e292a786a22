"""Checklists: synthesis asks evaluation's decomposition step (prompt, schema, parser) and adds its data checks."""

from __future__ import annotations

import asyncio
import json

import pytest

from cupid_exp.evaluators.checklist import DECOMPOSER_PROMPT, checklist_schema
from cupid_exp.llm.replies import Invalid, ParseError
from cupid_exp.prompts import PromptSet
from cupid_exp.synthesis.steps import validation as steps

from ..scripted import ScriptedServer, context, counts, reply

ITEMS = ["Does the response use three bullet points?", "Does it give euro amounts?", "Is it under 100 words?"]


def test_the_shared_step_with_synthesis_max_items(tmp_path) -> None:
    """Evaluation's prompt and schema (maxItems = synthesis.max_checklist_items), the list cut to that many."""
    with ScriptedServer([reply({"analysis": "Three requirements.", "checklist": ITEMS})]) as server:
        ctx = context(server.url, tmp_path, max_checklist_items=2)
        ctx.clients["decomposer"].model.structured_output = True
        items = asyncio.run(steps.decompose(ctx, "Three bullet points with euro amounts, under 100 words."))
    assert items == ITEMS[:2]
    request = server.requests[0]
    assert request["response_format"]["json_schema"]["schema"] == json.loads(json.dumps(checklist_schema(2)))
    expected = PromptSet().get(DECOMPOSER_PROMPT).messages("system", preferences="Three bullet points with euro "
                                                                                 "amounts, under 100 words.")
    assert request["messages"] == expected
    assert counts(ctx, "decompose")["calls"] == 1


def test_data_checks_on_top_of_the_parser() -> None:
    parse = steps.checklist_parser(2)
    dupes = json.dumps({"checklist": [ITEMS[0], f" {ITEMS[0]} ", ITEMS[1], ITEMS[2]]})
    assert parse(dupes) == ITEMS[:2]  # duplicates go before the cut
    with pytest.raises(Invalid, match="placeholders"):
        parse(json.dumps({"checklist": ["<question 1>", "<question 2>"]}))
    # a copied placeholder beside real questions is dropped, the real ones kept (seed 1 on SmolLM2-135M)
    assert parse(json.dumps({"checklist": ["Is it brief?", "<question 2>"]})) == ["Is it brief?"]
    with pytest.raises(Invalid, match="yes/no question"):
        parse(json.dumps({"checklist": ["Short?", "Depth"]}))
    # a fragment beside a real question is dropped too, before the cut (seed 0 on SmolLM2-135M: "Tailwind", "NuBoom")
    assert parse(json.dumps({"checklist": ["Depth", "Is it brief?", "Tailwind", "Is it formal?"]})) == [
        "Is it brief?", "Tailwind"]
    for bad in ("no json", json.dumps({"checklist": []}), json.dumps({"checklist": [["nested"]]}),
                json.dumps({"checklist": "one string"}), json.dumps([{"q": 1}])):
        with pytest.raises(ParseError):
            parse(bad)


def test_a_copied_example_is_asked_again(tmp_path) -> None:
    copied = reply({"checklist": ["<question 1>", "<question 2>"]})
    with ScriptedServer([copied, reply({"checklist": ITEMS})]) as server:
        ctx = context(server.url, tmp_path)
        assert asyncio.run(steps.decompose(ctx, "A preference.")) == ITEMS
    assert "Attempt 2" in server.requests[1]["messages"][-1]["content"]
    assert counts(ctx, "decompose")["invalid_attempt"] == 1


def test_evaluation_keeps_its_schema() -> None:
    """Evaluation's default (4 items) is the schema it had before the step was shared: same cache keys."""
    from cupid_exp.evaluators.checklist import CHECKLIST_SCHEMA

    before = {"type": "object",
              "properties": {"analysis": {"type": "string", "maxLength": 400},
                             "checklist": {"type": "array", "items": {"type": "string", "minLength": 5,
                                                                      "maxLength": 200},
                                           "minItems": 1, "maxItems": 4}},
              "required": ["analysis", "checklist"]}
    assert CHECKLIST_SCHEMA == checklist_schema(4) == before
