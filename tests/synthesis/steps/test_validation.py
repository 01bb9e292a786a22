"""Validation step (paper App. E): one flag per checklist item, identical checks asked once per persona."""

from __future__ import annotations

import asyncio

import pytest

from cupid_exp.synthesis.journey import make_template
from cupid_exp.synthesis.steps import validation as steps

from ..scripted import WRONG_SHAPES, ScriptedServer, assert_rejected, context, reply


def test_flags_per_item() -> None:
    build = steps.build_expression(3)
    data = {"results": [{"index": 1, "evidence": "", "expressed": True}, {"expressed": "no"}, {"expressed": "Yes"}]}
    assert build(data) == [True, False, True]
    assert build([True, False, "true"]) == [True, False, True]


@pytest.mark.parametrize("data", [*WRONG_SHAPES, {"results": [{"expressed": True}]},
                                  {"results": [{"index": 1}, {"expressed": True}]},
                                  {"results": [{"expressed": "maybe"}, {"expressed": True}]},
                                  {"results": {"1": True, "2": False}}, [[True], [False]]])
def test_refuses_wrong_shapes(data) -> None:
    assert_rejected(steps.build_expression(2), data)


def test_identical_checks_are_asked_once(tmp_path) -> None:
    """Consistent and contrastive instances share the current preference's check: it is asked once."""
    journey = make_template(0, 1)
    factors = [{"factor": f"F{i}", "preference": f"P{i}", "related_factor": "N/A"} for i in range(8)]
    checklists = {f"P{i}": [f"Q{i}?"] for i in range(8)} | {"C": ["QC?"]}
    dialogues = [{"dialogue": [{"role": "user", "content": f"u{i}"}, {"role": "assistant", "content": "a"}]}
                 for i in range(12)]
    rows = [{"persona_id": "1+x", "instance_type": t, "current_checklist": ["Q?"], "current_request": "R"}
            for t in ("consistent", "contrastive", "changing")]
    with ScriptedServer([reply({"results": [{"index": 1, "evidence": "u", "expressed": True}]})]) as server:
        out = asyncio.run(steps.validate_persona(context(server.url, tmp_path), journey, factors, "C", checklists,
                                                 dialogues, rows))
    # the original preference (asked for all three), contrastive, changed, the leak (all three): 4 checks
    assert len(server.requests) == 4
    assert [len(v["checks"]) for v in out] == [1, 2, 2] and all(v["leaked"] == [True] for v in out)
    assert all(c["expressed"] == [True] for v in out for c in v["checks"])
