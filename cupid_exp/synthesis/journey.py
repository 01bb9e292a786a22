"""The journey template (paper B.3) and instances (B.5): pure functions of the seed; the LLM fills the slots."""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

N_FACTORS = 8  # six ordinary factors, then the contrastive pair (indices 6 and 7)
N_SESSIONS = 13
PAIR = (6, 7)

# Slot kinds. The final session carries the current factor with the changed preference (paper B.3/B.5).
CURRENT, CHANGED, CONTRASTIVE, OTHER, FINAL = "current", "changed", "contrastive", "other", "final"


@dataclass(frozen=True)
class Slot:
    index: int  # 0-based session position
    kind: str
    factor: int  # index into the persona's 8 factors


@dataclass(frozen=True)
class JourneyTemplate:
    slots: tuple[Slot, ...]
    current_factor: int  # one member of the contrastive pair, chosen at random
    contrastive_factor: int  # the other member
    drop_contrastive: tuple[int, ...]  # two random 'other' sessions removed from the Contrastive instance
    drop_changing: tuple[int, ...]  # two random 'other' sessions removed from the Changing instance

    def positions(self, kind: str) -> list[int]:
        return [s.index for s in self.slots if s.kind == kind]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JourneyTemplate":
        return cls(slots=tuple(Slot(**s) for s in data["slots"]), current_factor=data["current_factor"],
                   contrastive_factor=data["contrastive_factor"],
                   drop_contrastive=tuple(data["drop_contrastive"]), drop_changing=tuple(data["drop_changing"]))


def persona_rng(seed: int, persona_index: int, purpose: str = "journey") -> random.Random:
    """A private RNG per (seed, persona, purpose); string seeds hash deterministically (sha512)."""
    return random.Random(f"{seed}/{persona_index}/{purpose}")


def make_template(seed: int, persona_index: int) -> JourneyTemplate:
    """Draw one persona's journey: the current factor takes 4 of the first 12 positions (two original, two changed
    preference), the contrastive factor 2, six ordinary factors one each; session 13 is the current factor, changed."""
    rng = persona_rng(seed, persona_index)
    current = rng.choice(PAIR)
    contrastive = PAIR[1] if current == PAIR[0] else PAIR[0]
    prior = list(range(N_SESSIONS - 1))
    a_positions = sorted(rng.sample(prior, 4))
    b_positions = sorted(rng.sample([i for i in prior if i not in a_positions], 2))
    other_positions = [i for i in prior if i not in a_positions and i not in b_positions]
    other_factors = rng.sample(range(PAIR[0]), len(other_positions))
    kinds = {**{i: (CURRENT, current) for i in a_positions[:2]}, **{i: (CHANGED, current) for i in a_positions[2:]},
             **{i: (CONTRASTIVE, contrastive) for i in b_positions}, N_SESSIONS - 1: (FINAL, current),
             **{i: (OTHER, f) for i, f in zip(other_positions, other_factors, strict=False)}}
    slots = tuple(Slot(i, *kinds[i]) for i in range(N_SESSIONS))
    return JourneyTemplate(slots=slots, current_factor=current, contrastive_factor=contrastive,
                           drop_contrastive=tuple(sorted(rng.sample(other_positions, 2))),
                           drop_changing=tuple(sorted(rng.sample(other_positions, 2))))


def slot_preference(slot: Slot, factors: Sequence[Mapping[str, Any]], changed_preference: str) -> str:
    return changed_preference if slot.kind in (CHANGED, FINAL) else factors[slot.factor]["preference"]


def removed_sessions(template: JourneyTemplate, instance_type: str) -> list[int]:
    """Paper B.5: which of the 12 prior sessions each instance type leaves out (always 4)."""
    changed = template.positions(CHANGED)
    contrastive = template.positions(CONTRASTIVE)
    if instance_type == "consistent":
        return sorted(changed + contrastive)
    if instance_type == "contrastive":
        return sorted(changed + list(template.drop_contrastive))
    if instance_type == "changing":
        return sorted(contrastive + list(template.drop_changing))
    raise ValueError(f"unknown instance type {instance_type!r}")


def snake_case(text: str) -> str:
    text = text.lower().replace("/", " and ").replace("&", " and ")
    return re.sub(r"[^a-z0-9]+", "_", text).strip("_") or "persona"


def persona_id(persona_index: int, occupation: str) -> str:
    return f"{persona_index}+{snake_case(occupation)}"


def build_instances(pid: str, template: JourneyTemplate, factors: Sequence[Mapping[str, Any]],
                    changed_preference: str, checklists: Mapping[str, Sequence[str]],
                    sessions: Sequence[Mapping[str, Any]], dialogues: Sequence[Sequence[Mapping[str, str]]],
                    ) -> list[dict[str, Any]]:
    """The three CUPID rows of one persona in the Hub schema, each with 8 prior sessions in journey order."""
    if len(template.slots) != N_SESSIONS or len(sessions) != N_SESSIONS or len(dialogues) < N_SESSIONS - 1:
        raise ValueError("a journey needs 13 sessions and 12 prior dialogues")
    current = factors[template.current_factor]
    final_request = sessions[N_SESSIONS - 1]["request"]
    rows = []
    for instance_type in ("consistent", "contrastive", "changing"):
        removed = set(removed_sessions(template, instance_type))
        prior = [{"context_factor": factors[slot.factor]["factor"],
                  "contextual_preference": slot_preference(slot, factors, changed_preference),
                  "dialogue": [dict(role=m["role"], content=m["content"]) for m in dialogues[slot.index]]}
                 for slot in template.slots[:-1] if slot.index not in removed]
        preference = changed_preference if instance_type == "changing" else current["preference"]
        rows.append({"persona_id": pid, "instance_type": instance_type, "current_request": final_request,
                     "current_context_factor": current["factor"], "current_contextual_preference": preference,
                     "current_checklist": list(checklists[preference]), "prior_interactions": prior})
    return rows


def relevant_checks(template: JourneyTemplate, factors: Sequence[Mapping[str, Any]], changed_preference: str,
                    instance_type: str) -> list[tuple[str, str, list[int]]]:
    """Paper App. E: (role, preference, prior sessions that must express it) per instance type."""
    original = factors[template.current_factor]["preference"]
    a = template.positions(CURRENT)
    if instance_type == "consistent":
        return [("current", original, a)]
    if instance_type == "contrastive":
        return [("current", original, a),
                ("contrastive", factors[template.contrastive_factor]["preference"], template.positions(CONTRASTIVE))]
    if instance_type == "changing":
        return [("prior", original, a), ("current", changed_preference, template.positions(CHANGED))]
    raise ValueError(f"unknown instance type {instance_type!r}")


def plan_factors(seed: int, persona_index: int) -> list[dict[str, Any]]:
    """Code-chosen types for the 8 factor slots (paper Table 7): distinct factor and preference types, one to three task
    types each (shared by the contrastive pair)."""
    from cupid_exp.synthesis import taxonomy

    rng = persona_rng(seed, persona_index, "factors")
    factor_types = rng.sample(taxonomy.FACTOR_TYPES, PAIR[0] + 1)
    preference_types = rng.sample(taxonomy.PREFERENCE_TYPES, PAIR[0] + 1)
    plan = [{"factor_type": factor_types[i], "preference_type": preference_types[i],
             "task_types": rng.sample(taxonomy.TASK_TYPES, rng.randint(1, 3))} for i in range(PAIR[0] + 1)]
    return plan + [dict(plan[-1], task_types=list(plan[-1]["task_types"]))]


def session_task_type(seed: int, persona_index: int, session_index: int, task_types: Sequence[str]) -> str:
    return persona_rng(seed, persona_index, f"task/{session_index}").choice(list(task_types))
