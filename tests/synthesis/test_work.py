"""Synthesis as the job lifecycle's kind of work: how many personas run at once, what its journal records are."""

from __future__ import annotations

from pathlib import Path

import pytest

from cupid_exp.config import CallsConfig, ModelConfig
from cupid_exp.durability.journal import whole_record
from cupid_exp.llm.client import clients_for
from cupid_exp.llm.pools import forget_pools
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.synthesis.config import ROLES
from cupid_exp.synthesis.phases import PersonaOutcome
from cupid_exp.synthesis.steps import SynthContext
from cupid_exp.synthesis.work import in_flight, is_final


def _context(tmp_path: Path, endpoint_of: dict[str, tuple[str, int]]) -> SynthContext:
    """Each role on (api_base, max_concurrency), with its own decoding (so a config, a client, of its own)."""
    forget_pools()
    runtime = CallsConfig(cache_dir=str(tmp_path / "cache"))
    roles = {role: ModelConfig(name=role, litellm_model="openai/stub", api_base=base, max_concurrency=slots,
                               params={"temperature": 0.1 * i})
             for i, (role, (base, slots)) in enumerate(endpoint_of.items())}
    return SynthContext(clients=clients_for(roles, runtime, UsageMeter()), prompts=None)


@pytest.mark.parametrize("layout,personas", [
    ({role: ("http://127.0.0.1:1/v1", 64) for role in ROLES}, 128),  # one pool taking 64 calls: two personas a slot
    ({role: ("http://127.0.0.1:1/v1", 1) for role in ROLES}, 1),  # one call at a time: one persona at a time
    ({**{role: ("http://127.0.0.1:1/v1", 16) for role in ROLES}, "user_simulator": ("http://127.0.0.1:2/v1", 8)}, 48),
    ({**{role: ("http://127.0.0.1:1/v1", 4) for role in ROLES}, "validator": ("http://127.0.0.1:1/v1", 32)}, 64),
], ids=["one pool at 64", "one pool at 1", "two pools", "one pool, its roles at 4 and 32"])
def test_personas_in_flight_follow_what_the_roles_pools_take(tmp_path: Path, layout, personas: int) -> None:
    """Two personas a slot: a persona is a chain of calls, and a call refused with a retry-after waits it out while
    the other persona of its slot sends (issue 40 item 2); an embedded model's one slot, one persona."""
    ctx = _context(tmp_path, layout)
    assert in_flight(ctx) == personas


def test_a_personas_journal_record_says_whether_it_stands(tmp_path: Path) -> None:
    done = PersonaOutcome(index=3, journey={"persona": {"persona_id": "3+nurse"}}, instances=[{}, {}, {}])
    failed = PersonaOutcome(index=4, journey={}, failed_phase="factors", error="factors: unparseable: x",
                            failed_kind="unparseable")
    assert done.to_record() == {"key": "persona_003", "index": 3, "persona_id": "3+nurse", "status": "done",
                                "errors": [], "instances": 3, "dropped": 0}
    assert failed.to_record()["errors"] == [{"step": "factors", "kind": "unparseable",
                                             "message": "factors: unparseable: x"}]
    fields = {"key": str, "index": int, "status": str, "errors": list}  # as ``load_synthesis`` gives the journal
    assert whole_record(done.to_record(), fields) is None and whole_record({"key": "persona_003"}, fields)
    journeys = tmp_path / "journeys"
    assert not is_final(journeys, failed.to_record(), False)  # a failed persona is tried again
    assert not is_final(journeys, done.to_record(), False)  # its journey file is gone: it runs again
    journeys.mkdir()
    (journeys / "persona_003.json").write_text('{"status": "done"}')
    assert is_final(journeys, done.to_record(), False)
