"""Steps 4 and 7 (paper B.4, App. E, Fig. 20): each preference as a yes/no checklist, by the evaluator's decomposition
(no placeholders, no fragments, no duplicates, at most ``synthesis.max_checklist_items``); then which checklist items
the user's messages express, and what the request leaks."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Sequence

from cupid_exp.evaluators.checklist import decompose as decompose_preference
from cupid_exp.evaluators.checklist import parse_checklist
from cupid_exp.job.lanes import together
from cupid_exp.llm.replies import Invalid
from cupid_exp.llm.steps import StepFailed, Transcript
from cupid_exp.rendering import numbered
from cupid_exp.synthesis.journey import JourneyTemplate, relevant_checks
from cupid_exp.synthesis.steps.base import PLACEHOLDER_REASON, SynthContext
from cupid_exp.synthesis.steps.checks import placeholders

MIN_QUESTION = 8  #: characters: shorter is a fragment ("Depth", "prefers"), not a yes/no question


def checklist_parser(max_items: int) -> Callable[[str], list[str]]:
    """``parse_checklist`` plus the data checks; duplicates and fragments go before the cut to ``max_items``."""
    def parse(reply: str) -> list[str]:
        items = parse_checklist(reply)
        # a placeholder copied from the prompt's example beside real questions is dropped (a tiny model
        # often appends one); a list of placeholders only is refused and asked again
        real = [x for x in items if not placeholders(x)]
        if not real:
            raise Invalid(PLACEHOLDER_REASON)
        # so is a fragment beside real questions (SmolLM2-135M's ["Tailwind", "NuBoom"]: seed 0's first persona
        # failed there, each of its four attempts refused for one fragment)
        cleaned = [x for x in dict.fromkeys(" ".join(x.split()) for x in real) if len(x) >= MIN_QUESTION]
        if not cleaned:
            raise Invalid("every checklist entry must be a yes/no question")
        return cleaned[:max_items]

    return parse


async def decompose(ctx: SynthContext, preference: str) -> list[str]:
    return await decompose_preference(ctx.clients["decomposer"], ctx.prompts, preference, transcript=Transcript(),
                                      retry=ctx.retry, max_items=ctx.max_checklist_items,
                                      parse=checklist_parser(ctx.max_checklist_items))


def expression_schema(n_items: int) -> dict:
    item = {"type": "object", "properties": {"index": {"type": "integer", "enum": list(range(1, n_items + 1))},
                                             "evidence": {"type": "string", "maxLength": 100},
                                             "expressed": {"type": "boolean"}},
            "required": ["index", "evidence", "expressed"]}
    return {"type": "object", "properties": {"results": {"type": "array", "items": item, "minItems": n_items,
                                                         "maxItems": n_items}}, "required": ["results"]}


def _flag(result: object) -> bool:
    value = result.get("expressed") if isinstance(result, dict) else result
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "false", "no"):
        value = value.strip().lower() in ("true", "yes")
    if not isinstance(value, bool):
        raise Invalid("'expressed' must be true or false")
    return value


def build_expression(n_items: int) -> Callable[[object], list[bool]]:
    def build(data: object) -> list[bool]:
        results = data.get("results") if isinstance(data, dict) else data
        if not isinstance(results, list) or len(results) != n_items:
            raise Invalid(f"give exactly {n_items} results, one per checklist question")
        return [_flag(r) for r in results]

    return build


async def check_expressed(ctx: SynthContext, checklist: Sequence[str], user_messages: Sequence[str],
                          step: str) -> list[bool]:
    """Which checklist questions the user's messages express (one flag per question)."""
    messages = ctx.prompts.get("synthesis/expression_validator").messages(
        ctx.system_role("validator"), checklist=numbered(checklist),
        user_messages="\n".join(f"- {m}" for m in user_messages) or "(none)")
    return await ctx.ask_json("validator", step, messages, expression_schema(len(checklist)),
                              build_expression(len(checklist)))


async def validate_persona(ctx: SynthContext, journey: JourneyTemplate, factors: list[dict], changed: str,
                           checklists: Mapping[str, list[str]], dialogues: list[dict],
                           instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per instance: items the relevant sessions express and the request leaks; a failed check stays on its instance."""
    memo: dict[tuple, asyncio.Task] = {}

    def ask(checklist: list[str], messages: list[str], step: str) -> asyncio.Task:
        key = (tuple(checklist), tuple(messages))
        if key not in memo:
            memo[key] = asyncio.ensure_future(check_expressed(ctx, checklist, messages, step))
        return memo[key]

    async def one(row: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"persona_id": row["persona_id"], "instance_type": row["instance_type"],
                               "checks": [], "errors": []}
        for role, pref, positions in relevant_checks(journey, factors, changed, row["instance_type"]):
            user_messages = [m["content"] for i in positions for m in dialogues[i]["dialogue"] if m["role"] == "user"]
            check = {"preference_role": role, "preference": pref, "sessions": [i + 1 for i in positions],
                     "checklist": checklists[pref]}
            try:
                check["expressed"] = await ask(checklists[pref], user_messages, "validate_expressed")
            except StepFailed as exc:
                check["expressed"], check["error"] = None, str(exc)
                out["errors"].append(str(exc))
            out["checks"].append(check)
        try:
            out["leaked"] = await ask(row["current_checklist"], [row["current_request"]], "validate_leak")
        except StepFailed as exc:
            out["leaked"] = None
            out["errors"].append(str(exc))
        return out

    return await together(*(one(r) for r in instances))
