"""Journey template (paper B.3) and instance construction (paper B.5) on hand-built journeys."""

from __future__ import annotations

import pytest

from cupid_exp.data.schema import validate_row
from cupid_exp.synthesis.journey import (
    CHANGED,
    CONTRASTIVE,
    CURRENT,
    FINAL,
    N_SESSIONS,
    OTHER,
    PAIR,
    JourneyTemplate,
    Slot,
    build_instances,
    make_template,
    persona_id,
    plan_factors,
    relevant_checks,
    removed_sessions,
    snake_case,
)


def factors() -> list[dict]:
    out = [{"factor": f"Factor {i}", "preference": f"Preference of factor {i}, stated in full.",
            "related_factor": "N/A"} for i in range(8)]
    out[6]["related_factor"], out[7]["related_factor"] = "Factor 7", "Factor 6"
    return out


CHANGED_PREF = "The changed preference of the current factor."


def hand_built() -> JourneyTemplate:
    """Current factor 7 at 1, 4 (original) and 8, 10 (changed); contrastive 6 at 2, 9; others elsewhere."""
    kinds = {1: (CURRENT, 7), 4: (CURRENT, 7), 8: (CHANGED, 7), 10: (CHANGED, 7), 2: (CONTRASTIVE, 6),
             9: (CONTRASTIVE, 6), 0: (OTHER, 3), 3: (OTHER, 0), 5: (OTHER, 5), 6: (OTHER, 1), 7: (OTHER, 4),
             11: (OTHER, 2), 12: (FINAL, 7)}
    return JourneyTemplate(slots=tuple(Slot(i, *kinds[i]) for i in range(13)), current_factor=7,
                           contrastive_factor=6, drop_contrastive=(0, 5), drop_changing=(7, 11))


def build(template: JourneyTemplate) -> list[dict]:
    fs = factors()
    checklists = {f["preference"]: [f"Is {f['factor']} respected?"] for f in fs}
    checklists[CHANGED_PREF] = ["Is the change respected?"]
    sessions = [{"request": f"Request of session {i + 1}"} for i in range(N_SESSIONS)]
    dialogues = [[{"role": "user", "content": f"u{i + 1}"}, {"role": "assistant", "content": f"a{i + 1}"}]
                 for i in range(N_SESSIONS - 1)]
    return build_instances("3+nurse", template, fs, CHANGED_PREF, checklists, sessions, dialogues)


def sessions_of(row: dict) -> list[int]:
    return [int(p["dialogue"][0]["content"][1:]) for p in row["prior_interactions"]]


def test_instances_follow_paper_b5_on_a_hand_built_journey() -> None:
    rows = {r["instance_type"]: r for r in build(hand_built())}
    assert list(rows) == ["consistent", "contrastive", "changing"]
    # 1-based session numbers: A = 2, 5; A' = 9, 11; B = 3, 10; others = 1, 4, 6, 7, 8, 12
    assert sessions_of(rows["consistent"]) == [1, 2, 4, 5, 6, 7, 8, 12]  # minus A' and B
    assert sessions_of(rows["contrastive"]) == [2, 3, 4, 5, 7, 8, 10, 12]  # minus A' and two others (1, 6)
    assert sessions_of(rows["changing"]) == [1, 2, 4, 5, 6, 7, 9, 11]  # minus B and two others (8, 12)
    for row in rows.values():
        assert len(row["prior_interactions"]) == 8
        assert row["current_request"] == "Request of session 13"
        assert row["current_context_factor"] == "Factor 7"
        assert row["persona_id"] == "3+nurse"
        validate_row(row, "test")
    original = "Preference of factor 7, stated in full."
    assert rows["consistent"]["current_contextual_preference"] == original
    assert rows["contrastive"]["current_contextual_preference"] == original
    assert rows["changing"]["current_contextual_preference"] == CHANGED_PREF
    assert rows["changing"]["current_checklist"] == ["Is the change respected?"]
    assert rows["consistent"]["current_checklist"] == ["Is Factor 7 respected?"]
    # prior sessions carry their own factor and preference: A' sessions the changed one
    by_session = {int(p["dialogue"][0]["content"][1:]): p for p in rows["changing"]["prior_interactions"]}
    assert by_session[9]["contextual_preference"] == CHANGED_PREF
    assert by_session[2]["contextual_preference"] == original
    assert by_session[1]["context_factor"] == "Factor 3"
    # contrastive sessions appear only in the contrastive instance
    assert {p["context_factor"] for p in rows["contrastive"]["prior_interactions"]} >= {"Factor 6", "Factor 7"}
    assert "Factor 6" not in {p["context_factor"] for p in rows["consistent"]["prior_interactions"]}
    assert "Factor 6" not in {p["context_factor"] for p in rows["changing"]["prior_interactions"]}


def test_removed_sessions_are_four_of_the_right_kind() -> None:
    t = hand_built()
    assert removed_sessions(t, "consistent") == [2, 8, 9, 10]
    assert removed_sessions(t, "contrastive") == [0, 5, 8, 10]
    assert removed_sessions(t, "changing") == [2, 7, 9, 11]
    with pytest.raises(ValueError):
        removed_sessions(t, "other")


@pytest.mark.parametrize("seed,index", [(0, 1), (0, 2), (1, 1), (7, 40), (123, 5)])
def test_template_positions_follow_paper_b3(seed: int, index: int) -> None:
    t = make_template(seed, index)
    assert [s.index for s in t.slots] == list(range(13))
    assert {t.current_factor, t.contrastive_factor} == set(PAIR)
    assert t.slots[-1].kind == FINAL and t.slots[-1].factor == t.current_factor
    a, a2 = t.positions(CURRENT), t.positions(CHANGED)
    assert len(a) == 2 and len(a2) == 2 and max(a) < min(a2)  # first two original, last two changed
    assert all(t.slots[i].factor == t.current_factor for i in a + a2)
    b = t.positions(CONTRASTIVE)
    assert len(b) == 2 and all(t.slots[i].factor == t.contrastive_factor for i in b)
    others = t.positions(OTHER)
    assert len(others) == 6 and sorted(t.slots[i].factor for i in others) == list(range(6))  # distinct
    assert 12 not in a + a2 + b + others
    assert set(t.drop_contrastive) <= set(others) and len(set(t.drop_contrastive)) == 2
    assert set(t.drop_changing) <= set(others) and len(set(t.drop_changing)) == 2
    assert JourneyTemplate.from_dict(t.to_dict()) == t


def test_same_seed_same_structure_different_seed_different() -> None:
    first = [make_template(0, i) for i in range(1, 6)]
    assert first == [make_template(0, i) for i in range(1, 6)]
    assert first != [make_template(1, i) for i in range(1, 6)]
    assert len({make_template(0, i) for i in range(1, 30)}) > 25  # personas get their own positions


def test_positions_cover_the_whole_range() -> None:
    """Over many personas, the current factor lands on every prior position, the penultimate included."""
    seen = set()
    for i in range(300):
        t = make_template(0, i)
        seen |= set(t.positions(CURRENT) + t.positions(CHANGED))
    assert seen == set(range(12))


def test_relevant_checks_per_type() -> None:
    t, fs = hand_built(), factors()
    assert relevant_checks(t, fs, CHANGED_PREF, "consistent") == [("current", fs[7]["preference"], [1, 4])]
    assert [c[0] for c in relevant_checks(t, fs, CHANGED_PREF, "contrastive")] == ["current", "contrastive"]
    changing = relevant_checks(t, fs, CHANGED_PREF, "changing")
    assert changing == [("prior", fs[7]["preference"], [1, 4]), ("current", CHANGED_PREF, [8, 10])]


def test_persona_ids() -> None:
    assert snake_case("High School Chemistry Teacher") == "high_school_chemistry_teacher"
    assert persona_id(12, "Nurse/Midwife") == "12+nurse_and_midwife"
    assert persona_id(1, "!!!") == "1+persona"


def test_factor_plan_is_code_decided_from_the_taxonomies() -> None:
    from cupid_exp.synthesis import taxonomy

    plan = plan_factors(0, 1)
    assert plan == plan_factors(0, 1) and plan != plan_factors(1, 1)
    assert len(plan) == 8 and len({p["factor_type"] for p in plan[:7]}) == 7
    assert plan[6]["factor_type"] == plan[7]["factor_type"]  # the contrastive pair shares a type
    assert len({p["preference_type"] for p in plan[:7]}) == 7
    for p in plan:
        assert p["factor_type"] in taxonomy.FACTOR_TYPES and p["preference_type"] in taxonomy.PREFERENCE_TYPES
        assert 1 <= len(p["task_types"]) <= 3 and set(p["task_types"]) <= set(taxonomy.TASK_TYPES)
