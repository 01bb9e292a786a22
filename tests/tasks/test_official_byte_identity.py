"""With ``prompts.dir`` at an official CUPID checkout's ``prompts/``, every call is byte-identical to the
official tool's: inference, decomposition, both matcher directions (its few-shot examples read from its
source), PrefMatcher, generation and the judge — system role included.

Needs a checkout of kixlab/CUPID:
``CUPID_OFFICIAL_DIR=/path/to/CUPID pytest tests/tasks/test_official_byte_identity.py``
(skipped otherwise). Our side is what reached the (stub) server over HTTP; the official side is what its
own modules, run in a separate process with recording SDK stand-ins (``helpers/official_calls.py``),
hand to the SDK for the same instance and the same intermediate values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import compose_config
from helpers.jobs import run_one

from cupid_exp.evaluation import plan
from cupid_exp.testing.stub_llm_server import StubServer
from cupid_exp.testing.stub_replies import classify

OFFICIAL = os.environ.get("CUPID_OFFICIAL_DIR")
pytestmark = pytest.mark.skipif(not OFFICIAL, reason="set CUPID_OFFICIAL_DIR to an official CUPID checkout")
HELPER = Path(__file__).resolve().parents[1] / "helpers" / "official_calls.py"
ROLES = ("decomposer", "matcher", "judge")


def paper_plan(url: str, root: Path, *extra: str):
    """model=gpt4o with the evaluator it implies (the paper's), every endpoint at the stub: only the
    provider route and the address change, so roles and decoding are the shipped configs'."""
    overrides = ["model=gpt4o", "model.litellm_model=openai/stub", f"model.api_base={url}", "task=both",
                 f"prompts.dir={Path(OFFICIAL) / 'prompts'}", "calls.cache=false", "runtime.reask=0",
                 "tracking=none", "runtime.progress=false", f"paths.output_root={root}", *extra]
    for role in ROLES:
        overrides += [f"evaluator.{role}.litellm_model=openai/stub", f"evaluator.{role}.api_base={url}"]
    return plan(compose_config(overrides), root / "job")


def wire(bodies: list[dict]) -> dict[str, list[list[dict]]]:
    """The messages of each request, grouped by the step the stub recognised; match split by direction."""
    out: dict[str, list[list[dict]]] = {}
    for body in bodies:
        out.setdefault(classify(body), []).append(body["messages"])
    return out


def official(tmp_path: Path, given: dict) -> dict:
    (tmp_path / "in.json").write_text(json.dumps(given), encoding="utf-8")
    path = os.pathsep.join(filter(None, (OFFICIAL, os.environ.get("PYTHONPATH"))))  # the checkout's modules first
    subprocess.run([sys.executable, str(HELPER), str(tmp_path / "in.json"), str(tmp_path / "out.json")],
                   check=True, timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": path})
    return json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))


def given_values(job, result) -> dict:
    instance = job.work.units[0]
    inf = result.inference
    return {"current_request": instance.current_request,
            "prior_interactions": [{"context_factor": s.context_factor,
                                    "contextual_preference": s.contextual_preference,
                                    "dialogue": [{"role": m.role, "content": m.content} for m in s.dialogue]}
                                   for s in instance.prior_interactions],
            "gt_preference": instance.current_contextual_preference, "gt_checklist": list(instance.current_checklist),
            "inferred_preference": inf.inferred_preference, "inferred_checklist": inf.inferred_checklist,
            "subject_reply": f"### Analysis\n\nx\n\n### Most Likely Preference\n\n{inf.inferred_preference}",
            "response": result.generation.response if result.generation else ""}


def test_every_call_is_byte_identical_to_the_official_tools(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
    with StubServer(record_bodies=True) as stub:
        job = paper_plan(stub.url, tmp_path)
        result = run_one(job)
        ours = wire(stub.bodies)
    assert result.inference.f1 is not None and result.generation.judge_score is not None
    theirs = official(tmp_path, given_values(job, result))
    assert ours["infer"] == theirs["infer"]
    assert ours["decompose"] == theirs["decompose"]
    assert ours["generate"] == theirs["generate"]
    assert ours["judge"] == theirs["judge"]
    # the two matcher calls, in either order: the eight examples, the role, both directions
    assert sorted(map(json.dumps, ours["match"])) == sorted(
        map(json.dumps, theirs["match_precision"] + theirs["match_recall"]))
    assert len(ours["match"]) == 2 and ours["match"][0][0]["role"] == "developer"
    assert ours["match"][0][0]["content"].count("#### Output") >= 8  # the official examples are in the prompt
    assert [m["role"] for m in ours["infer"][0]] == ["system", "user"]


def test_prefmatcher_calls_are_byte_identical_too(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
    with StubServer(record_bodies=True) as stub:
        job = paper_plan(stub.url, tmp_path, "evaluator=prefmatcher", "task=inference")
        assert job.cfg.evaluator.matcher.name == "prefmatcher"
        result = run_one(job)
        ours = wire(stub.bodies)
    theirs = official(tmp_path, given_values(job, result))
    recall = [m for m in ours["match"] if result.inference.inferred_preference in m[-1]["content"]]
    assert len(recall) == 1 and recall == theirs["prefmatcher_recall"]
    assert [m["role"] for m in recall[0]] == ["system", "user"]
