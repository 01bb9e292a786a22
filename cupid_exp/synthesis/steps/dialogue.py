"""Step 5 (paper B.4): a simulated dialogue per prior session, user simulator against assistant simulator."""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Sequence

from cupid_exp.llm.replies import Invalid, ParseError
from cupid_exp.llm.steps import Messages, Resample, StepFailed, Transcript, ask
from cupid_exp.rendering import numbered
from cupid_exp.synthesis.steps.base import SynthContext, as_object, string_schema, text

OPENING = "(The conversation starts. Send your request to the AI assistant.)"
NO_ANSWER = "(no answer)"


def user_sim_schema(n_items: int) -> dict:
    return {"type": "object", "properties": {
        "evaluation": string_schema(10, 200),
        "score": {"type": "integer", "enum": list(range(1, 11))},
        "selected_items": {"type": "array", "maxItems": n_items,
                           "items": {"type": "integer", "enum": list(range(1, n_items + 1))}},
        "message": string_schema(5, 250)},
        "required": ["evaluation", "score", "selected_items", "message"]}


def _score(value: object) -> int:
    """A whole score from 1 to 10; '8/10' and 7.0 are accepted as 8 and 7."""
    if isinstance(value, str):
        value = int(re.sub(r"[^\d].*$", "", value.strip()) or "0")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= 10:
        raise Invalid("'score' must be a whole number from 1 to 10")
    return int(value)


def build_user_turn(n_items: int) -> Callable[[object], dict[str, Any]]:
    def build(data: object) -> dict[str, Any]:
        item = as_object(data, "user simulator's turn")
        selected = item.get("selected_items") or []
        if not isinstance(selected, list):
            raise ParseError("'selected_items' must be a list of checklist item numbers")
        score = _score(item.get("score"))
        message = text(item, "message", "user simulator's turn")
        if len(message) < 2:
            raise Invalid("'message' must not be empty")
        return {"evaluation": text(item, "evaluation", "user simulator's turn"), "score": score,
                "selected_items": [int(i) for i in selected if str(i).isdigit() and 1 <= int(i) <= n_items],
                "message": message}

    return build


def simulator_view(dialogue: Sequence[Mapping[str, str]]) -> Messages:
    """The dialogue from the user simulator's side: roles flipped, opened by a user turn."""
    flipped = [{"role": "assistant" if m["role"] == "user" else "user", "content": m["content"]} for m in dialogue]
    return [{"role": "user", "content": OPENING}, *flipped]


async def simulate_dialogue(ctx: SynthContext, *, persona_description: str, factor: str, preference: str,
                            checklist: Sequence[str], request: str, attempt: int = 0) -> dict[str, Any]:
    """User simulator vs assistant simulator until a score of 10 or ``max_turns`` replies. A failing user simulator ends
    it early (``error``); a failing assistant provider fails it (StepFailed)."""
    take = f"\n\n(Conversation {attempt + 1}.)" if attempt else ""
    assistant_system = ctx.prompts.get("synthesis/assistant_simulator").system.format() + take
    user_system = ctx.prompts.get("synthesis/user_simulator").system.format(
        user_profile=persona_description, context_factor=factor, preference=preference,
        checklist=numbered(checklist)) + take
    a_role, u_role = ctx.system_role("assistant_simulator"), ctx.system_role("user_simulator")
    assistant = ctx.clients["assistant_simulator"]
    dialogue: list[dict[str, str]] = [{"role": "user", "content": request}]
    turns: list[dict[str, Any]] = []
    satisfied, error = False, None
    for turn in range(ctx.max_turns):
        # the assistant simulator's text (seed moved per attempt); empty or cut replies stand, counted
        answer = await ask(assistant, "assistant_simulator", [{"role": a_role, "content": assistant_system}, *dialogue],
                           str.strip, transcript=Transcript(), params=ctx.retry.params(assistant, attempt),
                           retry=Resample(0), keep_cut=True)
        if not answer:
            assistant.meter.reject("assistant_simulator", "empty")
        dialogue.append({"role": "assistant", "content": answer or NO_ANSWER})
        try:
            judged = await ctx.ask_json("user_simulator", "user_simulator",
                                        [{"role": u_role, "content": user_system}, *simulator_view(dialogue)],
                                        user_sim_schema(len(checklist)), build_user_turn(len(checklist)))
        except StepFailed as exc:
            error = str(exc)
            break
        turns.append(judged)
        satisfied = judged["score"] == 10
        if satisfied or turn < ctx.max_turns - 1:  # the last reply of a dialogue cut at max_turns gets no answer
            dialogue.append({"role": "user", "content": judged["message"]})
        if satisfied:
            break
    return {"dialogue": dialogue, "is_satisfied": satisfied, "scores": [t["score"] for t in turns],
            "evaluations": turns, "attempt": attempt, "error": error}
