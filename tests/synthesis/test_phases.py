"""One persona through its phases, on the stub model: journey file, resume, failure at a phase, policies."""

from __future__ import annotations

import asyncio
import json

import pytest

from cupid_exp.synthesis.config import SynthesisConfig
from cupid_exp.synthesis.journey import make_template
from cupid_exp.synthesis.personas import builtin_seeds, sample_templates
from cupid_exp.synthesis.phases import filter_unsatisfied, synthesize_persona
from cupid_exp.synthesis.store import JourneyStore
from cupid_exp.testing.stub_llm_server import StubServer

from .scripted import ScriptedServer, context, counts, reply
from .test_journey import build, hand_built

TEMPLATE = sample_templates(1, 0, builtin_seeds(1, 0))[0]


def run_persona(ctx, tmp_path, **recipe):
    scfg = SynthesisConfig(name="test", **recipe)
    store = JourneyStore.open(tmp_path / "journeys", TEMPLATE, make_template(scfg.seed, TEMPLATE.index), scfg.seed)
    return asyncio.run(synthesize_persona(ctx, scfg, TEMPLATE, store)), store


def test_a_persona_runs_every_phase_and_a_finished_one_is_not_asked_again(tmp_path) -> None:
    with StubServer() as stub:
        ctx = context(stub.url, tmp_path, structured=True, max_turns=2)
        outcome, store = run_persona(ctx, tmp_path)
        first = stub.stats()["total_completed"]
        again, _ = run_persona(ctx, tmp_path)
        assert stub.stats()["total_completed"] == first  # nothing left to ask
    assert outcome.failed_phase is None and len(outcome.instances) == 3 and len(outcome.validation) == 3
    saved = json.loads(store.path.read_text())
    assert saved["status"] == "done" and "factors_partial" not in saved
    assert len(saved["factors"]) == 8 and all(s for s in saved["sessions"]) and all(saved["dialogues"])
    assert {s["kind"] for s in saved["sessions"]} == {"current", "changed", "contrastive", "other", "final"}
    assert again.instances == outcome.instances and again.validation == outcome.validation


def test_regenerate_asks_for_unsatisfied_dialogues_again_up_to_max_retries(tmp_path) -> None:
    with StubServer() as stub:
        ctx = context(stub.url, tmp_path, structured=True, max_turns=1)
        outcome, store = run_persona(ctx, tmp_path, on_unsatisfied="regenerate", max_retries=1, validate=False)
    dialogues = store.data["dialogues"]
    assert all(d["is_satisfied"] or d["attempt"] == 1 for d in dialogues)  # unsatisfied: asked again once
    assert any(d["attempt"] == 1 for d in dialogues) and all(d["attempt"] <= 1 for d in dialogues)
    kept = {r["instance_type"] for r in outcome.instances}
    assert len(kept) + len(outcome.dropped) == 3 and all("unsatisfied" in d["reason"] for d in outcome.dropped)


def test_a_step_that_fails_fails_the_persona_at_its_phase(tmp_path) -> None:
    persona = {"personas": [{"occupation": "Paediatric nurse", "description": "A senior nurse. " * 8}]}
    with ScriptedServer([reply(persona), reply("not json")]) as server:
        ctx = context(server.url, tmp_path, max_retries=1)
        outcome, store = run_persona(ctx, tmp_path)
    assert outcome.failed_phase == "factors" and outcome.error.startswith("factors: unparseable")
    saved = json.loads(store.path.read_text())
    assert saved["status"] == "failed" and saved["failed_phase"] == "factors" and "persona" in saved
    assert counts(ctx, "factors")["gave_up"] == 1 and len(server.requests) == 3


@pytest.mark.parametrize("policy,kept", [("keep", ["consistent", "contrastive", "changing"]),
                                         ("drop", ["consistent", "changing"]),
                                         ("regenerate", ["consistent", "changing"])])
def test_unsatisfied_dialogues_drop_only_the_instances_that_use_them(policy: str, kept: list[str]) -> None:
    t = hand_built()
    rows = build(t)
    dialogues = [{"is_satisfied": i != 2} for i in range(12)]  # session 3 (contrastive factor) unsatisfied
    out, dropped = filter_unsatisfied(rows, t, dialogues, policy)
    assert [r["instance_type"] for r in out] == kept
    assert all("sessions [3]" in d["reason"] for d in dropped)


def steps_in_order_sent(tmp_path) -> list[str]:
    """One persona on the stub (20 ms a call): each request's step, in the order the stub received them."""
    from cupid_exp.testing.stub_config import StubConfig
    from cupid_exp.testing.stub_replies import classify

    with StubServer(StubConfig(record_bodies=True, latency_ms=20)) as stub:
        ctx = context(stub.url, tmp_path, structured=True, max_turns=1)
        outcome, _ = run_persona(ctx, tmp_path, validate=False)
        steps = [classify(body) for body in stub.bodies]
    assert outcome.failed_phase is None and len(outcome.instances) == 3
    return steps


def test_dialogues_start_while_the_later_sessions_are_still_being_written(tmp_path) -> None:
    """A dialogue needs its own session and its preference's checklist, not all 13 sessions: before, every dialogue
    waited for the last session, and a persona kept one call in flight for its whole session phase."""
    steps = steps_in_order_sent(tmp_path)
    last_session = max(i for i, s in enumerate(steps) if s == "session")
    first_dialogue = min(i for i, s in enumerate(steps) if s == "user_simulator")
    assert first_dialogue < last_session, steps


def test_checklists_start_while_the_later_factors_are_still_being_written(tmp_path) -> None:
    """A preference's checklist needs only its factor: before, the checklists waited for all 8 factors and the
    changed preference, and a persona kept one call in flight for those ten calls."""
    steps = steps_in_order_sent(tmp_path)
    last_factor = max(i for i, s in enumerate(steps) if s == "factors")
    first_checklist = min(i for i, s in enumerate(steps) if s == "decompose")
    assert first_checklist < last_factor, steps


def test_checklists_started_beside_a_chain_that_fails_finish_and_are_saved(tmp_path, recwarn) -> None:
    """The persona fails at its chain's phase; what the checklists beside it made is kept for the resume."""
    import gc

    from cupid_exp.testing.stub_config import StubConfig

    with StubServer(StubConfig(garbage_steps=("changed_preference",), latency_ms=5)) as stub:
        ctx = context(stub.url, tmp_path, structured=True, max_retries=1)
        outcome, store = run_persona(ctx, tmp_path, validate=False)
        refused = stub.stats()["total_completed"]
    gc.collect()
    assert outcome.failed_phase == "changed_preference" and outcome.failed_kind == "unparseable"
    saved = json.loads(store.path.read_text())
    preferences = {f["preference"] for f in saved["factors"]}
    assert set(saved["checklists"]) == preferences and len(preferences) == 8
    assert refused == 1 + 8 + 2 + 8  # persona, factors, the changed preference twice, the checklists
    assert not [w for w in recwarn if "never retrieved" in str(w.message)]


def test_phases_run_beside_each_other_report_a_bug_first_else_the_earliest_phase() -> None:
    from cupid_exp.llm.steps import StepFailed
    from cupid_exp.synthesis.phases import PhaseFailed, in_phases

    async def fails(kind: str, delay: float):
        await asyncio.sleep(delay)
        raise StepFailed("step", kind, "failed") if kind != "bug" else TypeError("a bug of ours")

    async def ok():
        await asyncio.sleep(0.01)

    with pytest.raises(PhaseFailed) as failed:  # the dialogue failed first in time; the checklist is the earlier phase
        asyncio.run(in_phases([("sessions", ok()), ("checklists", fails("unparseable", 0.02)),
                               ("dialogues", fails("provider", 0.0))]))
    assert failed.value.phase == "checklists" and failed.value.failure.kind == "unparseable"
    with pytest.raises(TypeError, match="a bug of ours"):  # never hidden behind a step's failure
        asyncio.run(in_phases([("sessions", fails("provider", 0.0)), ("dialogues", fails("bug", 0.01))]))


def test_a_persona_stopped_while_its_checklists_run_leaves_no_call_behind(tmp_path) -> None:
    """Cancelled (Ctrl-C, the job stopping) in its factors: the checklists it started are cancelled with it."""
    from cupid_exp.testing.stub_config import StubConfig

    async def stop_after_two_factors(ctx, store_dir) -> list[asyncio.Task]:
        scfg = SynthesisConfig(name="test", validate=False)
        store = JourneyStore.open(store_dir, TEMPLATE, make_template(scfg.seed, TEMPLATE.index), scfg.seed)
        persona = asyncio.ensure_future(synthesize_persona(ctx, scfg, TEMPLATE, store))
        while len(store.data.get("factors_partial") or []) < 2:
            await asyncio.sleep(0.01)
        persona.cancel()
        with pytest.raises(asyncio.CancelledError):
            await persona
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]

    with StubServer(StubConfig(latency_ms=100)) as stub:
        ctx = context(stub.url, tmp_path, structured=True)
        left = asyncio.run(stop_after_two_factors(ctx, tmp_path / "journeys"))
    assert [t.get_coro().__qualname__ for t in left if "checklist" in t.get_coro().__qualname__] == []
