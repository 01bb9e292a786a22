"""Steps 1 and 2 (paper B.2): a persona written from its code-sampled template, its eight context factors (a
contrastive pair last), then the changed preference."""

from __future__ import annotations

import random
import re
from typing import Any, Callable, Mapping, Sequence

from cupid_exp.data.schema import normalize_text
from cupid_exp.llm.replies import Invalid
from cupid_exp.llm.steps import StepFailed
from cupid_exp.synthesis import taxonomy
from cupid_exp.synthesis.journey import N_FACTORS, PAIR
from cupid_exp.synthesis.steps.base import SynthContext, as_object, string_schema, text
from cupid_exp.synthesis.steps.checks import looks_english, name_key, overlap, same_text

PERSONA_SCHEMA = {
    "type": "object",
    "properties": {"personas": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
        "type": "object",
        "properties": {"occupation": string_schema(3, 40), "description": string_schema(100, 700)},
        "required": ["occupation", "description"]}}},
    "required": ["personas"],
}


def build_persona(data: object) -> dict[str, str]:
    """{'personas': [{...}]}, a bare list of personas, or a bare persona object: the first persona."""
    item = data.get("personas") if isinstance(data, dict) and "personas" in data else data
    if isinstance(item, list):
        item = item[0] if item else None
    item = as_object(item, "persona")
    occupation = re.split(r"[.,;:(\n]", text(item, "occupation", "persona"))[0].strip(" .'\"")
    persona = {"description": text(item, "description", "persona"), "occupation": occupation}
    problems = []
    if len(persona["description"]) < 80:
        problems.append("the description must be several sentences long")
    if not re.search(r"[A-Za-z]{3}", persona["occupation"]) or len(persona["occupation"].split()) > 6:
        problems.append("the occupation must be a short job title of two to four words")
    if problems:
        raise Invalid(problems)
    return persona


async def write_persona(ctx: SynthContext, rendered_template: str) -> dict[str, str]:
    messages = ctx.prompts.get("synthesis/persona_generator").messages(
        ctx.system_role("persona_writer"), seed_descriptions=rendered_template)
    return await ctx.ask_json("persona_writer", "persona", messages, PERSONA_SCHEMA, build_persona)


FACTOR_SCHEMA = {"type": "object", "properties": {"factor": string_schema(3, 50),
                                                  "background": string_schema(20, 200),
                                                  "preference": string_schema(30, 200)},
                 "required": ["factor", "background", "preference"]}
NAME_ATTEMPTS = 2  # the model's own attempts at a factor before a repeated or generic name is swapped in code

_GENERIC_NAME = re.compile(r"^(the )?(context )?(factor|item|thing|person|place|tool|event|name)\s*[a-z0-9]?$|^[.<>]*$",
                           re.I)


def _factor(data: object, slot: Mapping[str, Any]) -> dict[str, Any]:
    """The model's text in a code-planned slot (factor type, preference type, task types)."""
    item = as_object(data, "context factor")
    return {"factor_type": slot["factor_type"], "background": text(item, "background", "context factor"),
            "factor": text(item, "factor", "context factor").strip(" ."), "task_types": list(slot["task_types"]),
            "preference_type": slot["preference_type"], "preference": text(item, "preference", "context factor"),
            "related_factor": "N/A"}


def _name_problems(f: Mapping[str, Any], label: str, existing: Sequence[Mapping[str, Any]]) -> list[str]:
    """What is wrong with the factor's name alone: a generic label, or a name another factor has."""
    problems = []
    if not f["factor"] or _GENERIC_NAME.match(f["factor"]) or "context factor" in f["factor"].lower():
        problems.append(f"{label} needs a specific name, not {f['factor']!r}")
    if any(name_key(e["factor"]) == name_key(f["factor"]) for e in existing):
        problems.append(f"{label}: the factor names must all be different ({f['factor']!r} is taken)")
    return problems


def _factor_problems(f: Mapping[str, Any], label: str, existing: Sequence[Mapping[str, Any]]) -> list[str]:
    problems = _name_problems(f, label, existing)
    if len(f["preference"]) < 20:
        problems.append(f"{label} ({f['factor']}) needs a full-sentence preference")
    elif not looks_english(f["preference"]):
        problems.append(f"{label} ({f['factor']}): write the preference in English")
    if f["factor_type"] not in taxonomy.FACTOR_TYPES:
        problems.append(f"{label} has unknown factor type {f['factor_type']!r}")
    if f["preference_type"] not in taxonomy.PREFERENCE_TYPES:
        problems.append(f"{label} has unknown preference type {f['preference_type']!r}")
    if not f["task_types"] or any(t not in taxonomy.TASK_TYPES for t in f["task_types"]):
        problems.append(f"{label} needs task types from the list")
    if any(name_key(e["preference"]) == name_key(f["preference"]) for e in existing):
        problems.append(f"{label}: the preferences must all be different")
    return problems


def fallback_name(factor_type: str, taken: Sequence[str], key: str) -> str | None:
    """A taxonomy name for a ``factor_type`` slot, none of ``taken``, in an order stable for ``key``."""
    names = list(taxonomy.FALLBACK_FACTOR_NAMES.get(factor_type, ()))
    random.Random(key).shuffle(names)
    used = {name_key(t) for t in taken}
    return next((n for n in names if name_key(n) not in used), None)


def validate_factors(factors: Sequence[Mapping[str, Any]]) -> list[str]:
    """Rules for one persona's 8 factors; returns the problems (empty = valid)."""
    if len(factors) != N_FACTORS:
        return [f"there must be exactly {N_FACTORS} context factors, got {len(factors)}"]
    problems = []
    for i, f in enumerate(factors):
        problems += _factor_problems(f, f"factor {i + 1}", factors[:i])
    a, b = factors[PAIR[0]], factors[PAIR[1]]
    if a["factor_type"] != b["factor_type"]:
        problems.append("the contrastive pair must share one factor type")
    if a["related_factor"] != b["factor"] or b["related_factor"] != a["factor"]:
        problems.append("the contrastive pair must name each other")
    if overlap(a["preference"], b["preference"]) > 0.8 and overlap(b["preference"], a["preference"]) > 0.8:
        problems.append("the contrastive pair's preferences must contradict each other, not repeat each other")
    if any(f["related_factor"] != "N/A" for f in factors[:PAIR[0]]):
        problems.append("only the last two factors may be related")
    return problems


class NameRepair:
    """After ``after`` attempts, a reply faulty only in its name takes a taxonomy name (``model_name`` kept)."""

    def __init__(self, after: int, key: str):
        self.after, self.key, self.attempts = after, key, 0

    def next_attempt(self) -> bool:
        self.attempts += 1
        return self.attempts > self.after

    def __call__(self, factor: dict[str, Any], label: str, existing: Sequence[Mapping[str, Any]]
                 ) -> dict[str, Any] | None:
        """The factor with a taxonomy name when its name has a problem (the builder checks the rest); None otherwise."""
        name = fallback_name(factor["factor_type"], [e["factor"] for e in existing], self.key)
        if name is None or not _name_problems(factor, label, existing):
            return None
        return dict(factor, factor=name, name_source="taxonomy", model_name=factor["factor"])


def build_factor(existing: Sequence[Mapping[str, Any]], label: str, slot: Mapping[str, Any],
                 repair: NameRepair | None = None) -> Callable[[object], dict[str, Any]]:
    return _builder(slot, lambda factor: _factor_problems(factor, label, existing), label, existing, repair)


def build_second(ordinary: Sequence[Mapping[str, Any]], first: Mapping[str, Any], slot: Mapping[str, Any],
                 repair: NameRepair | None = None) -> Callable[[object], dict[str, Any]]:
    """The pair's second member; code links the two (each names the other) and checks the whole set."""
    def check(second: dict[str, Any]) -> list[str]:
        return validate_factors([*ordinary, dict(first, related_factor=second["factor"]), second])

    return _builder(slot, check, f"factor {len(ordinary) + 2}", [*ordinary, first], repair,
                    related_factor=first["factor"])


def _builder(slot: Mapping[str, Any], check: Callable[[dict[str, Any]], list[str]], label: str,
             existing: Sequence[Mapping[str, Any]], repair: NameRepair | None, **linked: str
             ) -> Callable[[object], dict[str, Any]]:
    """A factor in ``slot`` that ``check`` finds nothing wrong with, or (once ``repair`` may) one renamed by it."""
    def build(data: object) -> dict[str, Any]:
        may_repair = repair is not None and repair.next_attempt()
        factor = dict(_factor(data, slot), **linked)
        problems = check(factor)
        if problems:
            repaired = repair(factor, label, existing) if may_repair else None
            if repaired is None or check(repaired):
                raise Invalid(problems)
            return repaired
        return factor

    return build


def _slot_text(slot: Mapping[str, Any]) -> str:
    return (f"Name {taxonomy.FACTOR_TYPE_HINTS[slot['factor_type']]} in this person's life. "
            f"Its preference is about {slot['preference_type'].lower()}. "
            f"It matters when the person asks for: {', '.join(slot['task_types']).lower()}.")


async def write_factors(ctx: SynthContext, persona_description: str, plan: Sequence[Mapping[str, Any]],
                        done: list[dict[str, Any]] | None = None,
                        on_factor: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """One call per factor (a tiny model drifts on long outputs; a rejected one is redone alone), in ``plan``'s slots.
    Earlier names are not shown (a tiny model copies them); clashes are rejected, later swapped (``NameRepair``)."""
    template = ctx.prompts.get("synthesis/context_factors_generator")
    role = ctx.system_role("factor_writer")
    model_attempts = min(NAME_ATTEMPTS, ctx.max_retries)

    def repair(label: str) -> NameRepair:
        return NameRepair(model_attempts, f"{label}/{persona_description}")

    def messages(what_to_write: str) -> list[dict[str, str]]:
        return template.messages(role, user_persona=persona_description, n_factors=N_FACTORS,
                                 what_to_write=what_to_write)

    factors = list(done or [])[:PAIR[0] + 1]
    while len(factors) <= PAIR[0]:
        k = len(factors)
        factors.append(await ctx.ask_json("factor_writer", "factors", messages(_slot_text(plan[k])), FACTOR_SCHEMA,
                                          build_factor(factors, f"factor {k + 1}", plan[k], repair(f"factor {k + 1}"))))
        if on_factor:
            on_factor(factors)
    first, slot = factors[PAIR[0]], plan[PAIR[1]]
    pair_text = (f"{_slot_text(slot)} It forms a contrastive pair with a similar thing of the same kind "
                 f"(not named here; choose a clearly different one) whose preference is: \"{first['preference']}\". "
                 f"Its own preference must contradict that one.")
    second = await ctx.ask_json("factor_writer", "factors", messages(pair_text), FACTOR_SCHEMA,
                                build_second(factors[:PAIR[0]], first, slot, repair(f"factor {PAIR[1] + 1}")))
    factors = [*factors[:PAIR[0]], dict(first, related_factor=second["factor"]), second]
    problems = validate_factors(factors)
    if problems:  # only reachable when resuming a partial list written under other rules
        raise StepFailed("factors", "invalid", "; ".join(problems))
    return factors


CHANGE_SCHEMA = {"type": "object", "properties": {"reason": string_schema(10, 200),
                                                  "preference": string_schema(30, 200)},
                 "required": ["reason", "preference"]}


def build_changed(original: str, others: Sequence[str]) -> Callable[[object], dict[str, str]]:
    def build(data: object) -> dict[str, str]:
        item = as_object(data, "changed preference")
        out = {"reason": text(item, "reason", "changed preference"),
               "preference": text(item, "preference", "changed preference")}
        new = normalize_text(out["preference"]).lower()
        problems = []
        if len(new) < 20:
            problems.append("the new preference must be a full sentence")
        if same_text(new, original):
            problems.append("the new preference must differ from the old one")
        if any(same_text(new, o) for o in others):
            problems.append("the new preference must differ from the other factors' preferences")
        if not looks_english(out["preference"]) or not looks_english(out["reason"]):
            problems.append("write the reason and the new preference in English")
        if re.match(r"^(no longer|not |do not|don't|never )", new):
            problems.append("state what is wanted now instead of negating the old preference")
        if problems:
            raise Invalid(problems)
        return out

    return build


async def write_changed_preference(ctx: SynthContext, persona_description: str, factor: Mapping[str, Any],
                                   others: Sequence[str]) -> dict[str, str]:
    messages = ctx.prompts.get("synthesis/preference_changer").messages(
        ctx.system_role("factor_writer"), user_persona=persona_description, context_factor=factor["factor"],
        preference=factor["preference"])
    return await ctx.ask_json("factor_writer", "changed_preference", messages, CHANGE_SCHEMA,
                              build_changed(factor["preference"], others))
