"""The job's numbers: synthesis counts plus the shared usage metrics, and when a job is incomplete."""

from __future__ import annotations

from cupid_exp.llm.usage import Completion, UsageMeter
from cupid_exp.synthesis.phases import PersonaOutcome
from cupid_exp.synthesis.summary import Completeness, rejections, summary_metrics, validation_table

DIALOGUE = {"dialogue": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
            "is_satisfied": False, "scores": [4], "attempt": 1, "error": None}
VALIDATION = {"persona_id": "1+x", "instance_type": "consistent", "errors": [], "leaked": [False, True],
              "checks": [{"preference_role": "current", "checklist": ["Q1?", "Q2?"], "expressed": [True, False]}]}


def outcomes() -> list[PersonaOutcome]:
    done = PersonaOutcome(1, {"factors": [{}] * 7 + [{"name_source": "taxonomy"}], "sessions": [{}] * 13,
                              "dialogues": [DIALOGUE] * 12},
                          instances=[{"instance_type": "consistent"}], validation=[VALIDATION])
    return [done, PersonaOutcome(2, {}, failed_phase="factors", error="factors: invalid: ...")]


def test_metrics_count_the_artefacts_and_carry_the_shared_usage() -> None:
    meter = UsageMeter()
    meter.add("persona", Completion("x", prompt_tokens=10, completion_tokens=5, retries=2))
    meter.reject("factors", "invalid")
    meter.fail("session", "rate_limit", retries=3)
    m = summary_metrics(outcomes(), meter, max_failed_fraction=0.1)
    assert (m["personas/requested"], m["personas/completed"], m["personas/failed"]) == (2, 1, 1)
    assert m["personas/failed/factors"] == 1 and m["personas/complete"] == 0
    assert m["factors/count"] == 8 and m["factors/names_from_taxonomy"] == 1
    assert m["dialogues/count"] == 12 and m["dialogues/regenerated"] == 12 and m["dialogues/unsatisfied"] == 12
    assert m["instances/count"] == 1 and m["instances/consistent"] == 1
    assert m["validation/items"] == 2 and m["validation/items_expressed"] == 1
    assert m["validation/instances_leaking"] == 1
    assert m["calls/retries"] == 5 and m["calls/requests"] == 1 + 1 + 5 and m["calls/failed"] == 1
    assert m["calls/factors/invalid_attempt"] == 1 and m["calls/session/failed_rate_limit"] == 1
    assert rejections(m) == "factors/invalid_attempt=1, session/failed_rate_limit=1"
    assert not any(k.startswith("errors/") for k in m)


def test_incomplete_above_max_failed_fraction() -> None:
    half = Completeness.of(outcomes(), 0.1)
    assert half.over_threshold and "1 of 2 personas failed (at factors=1)" in half.status_line()
    assert half.status_line().endswith("above runtime.max_failed_fraction=0.1: exit 3")
    assert not Completeness.of(outcomes(), 0.5).over_threshold
    assert Completeness.of(outcomes()[:1], 0.0).status_line() == "complete: 1 of 1 personas synthesised"


def test_validation_table_has_a_row_per_instance() -> None:
    table = validation_table(outcomes())
    assert table.to_dict("records") == [{"persona_id": "1+x", "instance_type": "consistent", "current_items": 2,
                                         "current_expressed": 1, "leak_items": 2, "leaked": 1,
                                         "all_expressed": False, "errors": 0}]
