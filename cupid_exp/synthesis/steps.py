"""The LLM steps of synthesis: each writes text into a slot that code has already laid out.

Every structured step asks for JSON under a JSON schema (constrained decoding where the model
supports it), builds the artefact in code, validates it in code, and on a parse or validation
failure asks again with the attempt number and the reason added to the prompt (so the cache key
changes), up to ``synthesis.max_retries`` extra attempts.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from cupid_exp.data.schema import normalize_text
from cupid_exp.llm.client import LLMClient, ProviderError
from cupid_exp.llm.replies import ParseError, parse_json_reply
from cupid_exp.prompts import PromptSet
from cupid_exp.rendering import numbered
from cupid_exp.synthesis import taxonomy
from cupid_exp.synthesis.journey import N_FACTORS, PAIR

Messages = list[dict[str, str]]


class Invalid(ValueError):
    """An artefact that parsed but breaks a rule; the message lists what to fix."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class StepFailed(Exception):
    """A step that produced no valid artefact after all attempts (or whose provider failed)."""

    def __init__(self, step: str, kind: str, message: str):
        self.step, self.kind = step, kind
        super().__init__(f"{step}: {kind}: {message}")


@dataclass
class SynthContext:
    clients: Mapping[str, LLMClient]  # role -> client
    prompts: PromptSet
    max_retries: int = 2
    max_turns: int = 4
    max_checklist_items: int = 4
    with_resources: bool = False
    # step -> kind -> count: attempts rejected (``*_attempt``) and steps that failed for good
    failures: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))

    def fail(self, step: str, kind: str) -> None:
        self.failures[step][kind] += 1

    def system_role(self, role: str) -> str:
        return self.clients[role].model.system_role


def with_attempt(messages: Messages, attempt: int, reason: str) -> Messages:
    """Attempt 0 is the plain prompt; later attempts say which attempt it is and what was wrong."""
    if attempt == 0:
        return list(messages)
    last = dict(messages[-1])
    note = f"(Attempt {attempt + 1}. The previous answer was rejected: {reason[:300]}. Write a new answer.)"
    last["content"] = f"{last['content']}\n\n{note}"
    return [*messages[:-1], last]


def attempt_params(client: LLMClient, attempt: int) -> dict[str, Any] | None:
    """A retry also resamples: the sampling seed moves with the attempt (a tiny model otherwise repeats
    the rejected answer almost word for word). Attempt 0 uses the model's own parameters."""
    if attempt == 0:
        return None
    return {"seed": int(client.model.params.get("seed") or 0) + attempt}


async def generate(ctx: SynthContext, role: str, step: str, messages: Messages, schema: dict,
                   build: Callable[[Any], Any]) -> Any:
    """Ask ``role`` for JSON, build and validate the artefact; regenerate on failure."""
    client = ctx.clients[role]
    reason = ""
    for attempt in range(ctx.max_retries + 1):
        try:
            completion = await client.complete(with_attempt(messages, attempt, reason), step=step, json_schema=schema,
                                               params=attempt_params(client, attempt))
        except ProviderError as exc:
            ctx.fail(step, exc.kind)
            raise StepFailed(step, exc.kind, str(exc)) from exc
        try:
            data = parse_json(completion.text)
            placeholders = _placeholders(data)
            if placeholders:
                raise Invalid([f"replace the template placeholders {placeholders[:3]} with real text"])
            return build(data)
        except ParseError as exc:
            kind, reason = "unparseable", str(exc)
        except Invalid as exc:
            kind, reason = "invalid", str(exc)
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:  # JSON of the wrong shape
            kind, reason = "invalid", f"wrong JSON shape ({type(exc).__name__}: {exc})"
        ctx.fail(step, f"{kind}_attempt")
    ctx.fail(step, "gave_up")
    raise StepFailed(step, kind, reason)


def parse_json(text: str) -> Any:
    """A JSON reply. llama.cpp's JSON grammar lets raw newlines into strings, so parse leniently first."""
    try:
        return json.loads(text.strip(), strict=False)
    except json.JSONDecodeError:
        return parse_json_reply(text)


_PLACEHOLDER = re.compile(r"<[A-Za-z][^<>\n]{1,40}>|^\.\.\.$")


def _placeholders(data: Any) -> list[str]:
    """Strings copied from the prompt's example ('<one sentence>', '...') instead of written."""
    if isinstance(data, str):
        return _PLACEHOLDER.findall(data.strip()) if _PLACEHOLDER.search(data.strip()) else []
    if isinstance(data, dict):
        return [p for v in data.values() for p in _placeholders(v)]
    if isinstance(data, list):
        return [p for v in data for p in _placeholders(v)]
    return []


# ---------------------------------------------------------------------------------------------
# text checks


_STOP = set("a an the and or but of to in on for with by at from as is are be that this these those it its "
            "their they them his her he she you your when whenever must should always never all any each every "
            "more most less than so very into about only also using use uses used".split())


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9']+", text.lower()) if len(w) > 2 and w not in _STOP}


def overlap(part: str, whole: str) -> float:
    """Share of ``part``'s content words that also occur in ``whole``."""
    words = content_words(part)
    return len(words & content_words(whole)) / len(words) if words else 0.0


def _text(data: Mapping[str, Any], key: str) -> str:
    value = data[key]
    if not isinstance(value, str):
        raise TypeError(f"'{key}' must be a string")
    return " ".join(value.split())


def _string(min_len: int, max_len: int) -> dict:
    return {"type": "string", "minLength": min_len, "maxLength": max_len}


# ---------------------------------------------------------------------------------------------
# personas


PERSONA_SCHEMA = {
    "type": "object",
    "properties": {"personas": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
        "type": "object",
        "properties": {"occupation": _string(3, 40), "description": _string(100, 700)},
        "required": ["occupation", "description"]}}},
    "required": ["personas"],
}


def build_persona(data: Any) -> dict[str, str]:
    item = data["personas"][0] if isinstance(data, dict) and "personas" in data else data
    if isinstance(item, list):
        item = item[0]
    occupation = re.split(r"[.,;:(\n]", _text(item, "occupation"))[0].strip(" .'\"")
    persona = {"description": _text(item, "description"), "occupation": occupation}
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
    return await generate(ctx, "persona_writer", "persona", messages, PERSONA_SCHEMA, build_persona)


# ---------------------------------------------------------------------------------------------
# context factors


FACTOR_TEXT = {"type": "object", "properties": {"factor": _string(3, 50), "background": _string(20, 200),
                                                "preference": _string(30, 200)},
               "required": ["factor", "background", "preference"]}
N_ORDINARY = N_FACTORS - 2
FACTOR_SCHEMA = FACTOR_TEXT

_GENERIC_NAME = re.compile(r"^(the )?(context )?(factor|item|thing|person|place|tool|event|name)\s*[a-z0-9]?$|^[.<>]*$",
                           re.I)


def _key(text: str) -> str:
    """Comparison key: letters and digits only, lower case ('The team,' == 'the team;')."""
    return re.sub(r"[^a-z0-9]+", "", text.lower())


def _factor(item: Mapping[str, Any], slot: Mapping[str, Any]) -> dict[str, Any]:
    """The LLM's text in a code-planned slot (factor type, preference type, task types)."""
    return {"factor_type": slot["factor_type"], "background": _text(item, "background"),
            "factor": _text(item, "factor").strip(" ."), "task_types": list(slot["task_types"]),
            "preference_type": slot["preference_type"], "preference": _text(item, "preference"),
            "related_factor": "N/A"}


def _factor_problems(f: Mapping[str, Any], label: str, existing: Sequence[Mapping[str, Any]]) -> list[str]:
    problems = []
    if not f["factor"] or _GENERIC_NAME.match(f["factor"]) or "context factor" in f["factor"].lower():
        problems.append(f"{label} needs a specific name, not {f['factor']!r}")
    if len(f["preference"]) < 20:
        problems.append(f"{label} ({f['factor']}) needs a full-sentence preference")
    if f["factor_type"] not in taxonomy.FACTOR_TYPES:
        problems.append(f"{label} has unknown factor type {f['factor_type']!r}")
    if f["preference_type"] not in taxonomy.PREFERENCE_TYPES:
        problems.append(f"{label} has unknown preference type {f['preference_type']!r}")
    if not f["task_types"] or any(t not in taxonomy.TASK_TYPES for t in f["task_types"]):
        problems.append(f"{label} needs task types from the list")
    if any(_key(e["factor"]) == _key(f["factor"]) for e in existing):
        problems.append(f"{label}: the factor names must all be different ({f['factor']!r} is taken)")
    if any(_key(e["preference"]) == _key(f["preference"]) for e in existing):
        problems.append(f"{label}: the preferences must all be different")
    return problems


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


def build_factor(existing: Sequence[Mapping[str, Any]], label: str, slot: Mapping[str, Any],
                 ) -> Callable[[Any], dict[str, Any]]:
    def build(data: Any) -> dict[str, Any]:
        factor = _factor(data, slot)
        problems = _factor_problems(factor, label, existing)
        if problems:
            raise Invalid(problems)
        return factor

    return build


def build_second(ordinary: Sequence[Mapping[str, Any]], first: Mapping[str, Any], slot: Mapping[str, Any],
                 ) -> Callable[[Any], dict[str, Any]]:
    """The pair's second member; code links the two (each names the other) and checks the whole set."""
    def build(data: Any) -> dict[str, Any]:
        second = dict(_factor(data, slot), related_factor=first["factor"])
        problems = validate_factors([*ordinary, dict(first, related_factor=second["factor"]), second])
        if problems:
            raise Invalid(problems)
        return second

    return build


def _slot_text(slot: Mapping[str, Any]) -> str:
    return (f"Name {taxonomy.FACTOR_TYPE_HINTS[slot['factor_type']]} in this person's life. "
            f"Its preference is about {slot['preference_type'].lower()}. "
            f"It matters when the person asks for: {', '.join(slot['task_types']).lower()}.")


async def write_factors(ctx: SynthContext, persona_description: str, plan: Sequence[Mapping[str, Any]],
                        done: list[dict[str, Any]] | None = None,
                        on_factor: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Six ordinary factors one at a time, then the two members of the contrastive pair.

    ``plan`` (code, seeded) fixes each slot's factor type, preference type and task types; the
    LLM writes background, name and preference. The earlier names are not shown (a tiny model
    copies them); a clash is rejected and the retry names it. One call per factor keeps each constrained
    generation short (a tiny model is slow and drifts on long outputs) and lets a rejected factor
    be regenerated alone. ``done`` resumes a partial list; ``on_factor`` is called after each
    accepted factor so the caller can save it.
    """
    template = ctx.prompts.get("synthesis/context_factors_generator")
    role = ctx.system_role("factor_writer")
    factors = list(done or [])[:N_ORDINARY]
    while len(factors) < N_ORDINARY:
        k = len(factors)
        messages = template.messages(role, user_persona=persona_description, n_factors=N_FACTORS,
                                     what_to_write=_slot_text(plan[k]))
        factors.append(await generate(ctx, "factor_writer", "factors", messages, FACTOR_SCHEMA,
                                      build_factor(factors, f"factor {k + 1}", plan[k])))
        if on_factor:
            on_factor(factors)
    if len(factors) == N_ORDINARY:  # first member of the contrastive pair
        slot = plan[PAIR[0]]
        messages = template.messages(role, user_persona=persona_description, n_factors=N_FACTORS,
                                     what_to_write=_slot_text(slot))
        factors.append(await generate(ctx, "factor_writer", "factors", messages, FACTOR_SCHEMA,
                                      build_factor(factors, f"factor {PAIR[0] + 1}", slot)))
        if on_factor:
            on_factor(factors)
    first, slot = factors[PAIR[0]], plan[PAIR[1]]
    messages = template.messages(
        role, user_persona=persona_description, n_factors=N_FACTORS,
        what_to_write=f"{_slot_text(slot)} It forms a contrastive pair with a similar thing of the same kind "
                      f"(not named here; choose a clearly different one) whose preference is: \"{first['preference']}\". "
                      f"Its own preference must contradict that one.")
    second = await generate(ctx, "factor_writer", "factors", messages, FACTOR_SCHEMA,
                            build_second(factors[:PAIR[0]], first, slot))
    factors = [*factors[:PAIR[0]], dict(first, related_factor=second["factor"]), second]
    problems = validate_factors(factors)
    if problems:  # only reachable when resuming a partial list written under other rules
        ctx.fail("factors", "gave_up")
        raise StepFailed("factors", "invalid", "; ".join(problems))
    return factors


CHANGE_SCHEMA = {"type": "object", "properties": {"reason": _string(10, 200), "preference": _string(30, 200)},
                 "required": ["reason", "preference"]}


def build_changed(original: str, others: Sequence[str]) -> Callable[[Any], dict[str, str]]:
    def build(data: Any) -> dict[str, str]:
        out = {"reason": _text(data, "reason"), "preference": _text(data, "preference")}
        new = normalize_text(out["preference"]).lower()
        problems = []
        if len(new) < 20:
            problems.append("the new preference must be a full sentence")
        if new == normalize_text(original).lower():
            problems.append("the new preference must differ from the old one")
        if any(new == normalize_text(o).lower() for o in others):
            problems.append("the new preference must differ from the other factors' preferences")
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
    return await generate(ctx, "factor_writer", "changed_preference", messages, CHANGE_SCHEMA,
                          build_changed(factor["preference"], others))


# ---------------------------------------------------------------------------------------------
# sessions


def session_schema(with_resources: bool) -> dict:
    props: dict[str, Any] = {"story": _string(40, 300), "request_with_preference": _string(30, 250),
                             "request": _string(20, 250)}
    if with_resources:
        props["resource"] = {"type": "string", "maxLength": 800}
    return {"type": "object", "properties": props, "required": list(props)}


def validate_session(session: Mapping[str, Any], preference: str, with_resources: bool) -> list[str]:
    problems = []
    request, with_pref = session["request"], session["request_with_preference"]
    if len(session["story"]) < 30:
        problems.append("the story must be two or three sentences")
    if len(request) < 15:
        problems.append("the request must be a full message")
    if normalize_text(request).lower() == normalize_text(with_pref).lower():
        problems.append("'request' must leave out the preference that 'request_with_preference' states")
    if normalize_text(preference).lower() in normalize_text(request).lower() or overlap(preference, request) >= 0.6:
        problems.append("'request' reveals the preference; remove every hint of it")
    if "[resource]" in request and not (with_resources and session.get("resource", "").strip()):
        problems.append("'request' refers to [resource] but no resource was written")
    return problems


def build_session(preference: str, task_type: str, with_resources: bool) -> Callable[[Any], dict]:
    def build(data: Any) -> dict[str, Any]:
        session = {"task_type": task_type, "story": _text(data, "story"),
                   "request_with_preference": _text(data, "request_with_preference"),
                   "request": _text(data, "request")}
        if with_resources:
            session["resource"] = str(data.get("resource") or "").strip()
        problems = validate_session(session, preference, with_resources)
        if problems:
            raise Invalid(problems)
        return session

    return build


def first_message(session: Mapping[str, Any]) -> str:
    """The user's opening message: the request without the preference, with its resource filled in."""
    request = session["request"]
    resource = session.get("resource") or ""
    return request.replace("[resource]", f"\n\n{resource}\n\n").strip() if resource else request


def earlier_scenarios(sessions: Sequence[Mapping[str, Any]], last: int = 2) -> str:
    done = [(i, s) for i, s in enumerate(sessions, start=1) if s]
    if not done:
        return "(none yet: this is the first scenario)"
    return "\n".join(f"- Scenario {i}: {s['story']}" for i, s in done[-last:])


async def write_session(ctx: SynthContext, *, persona_description: str, factor: Mapping[str, Any],
                        preference: str, task_type: str, session_number: int, n_sessions: int,
                        earlier: Sequence[Mapping[str, Any]], shift_reason: str | None) -> dict[str, Any]:
    import yaml

    block = yaml.dump({"context_factor": factor["factor"], "preference": preference, "task_type": task_type},
                      default_flow_style=False, sort_keys=False, allow_unicode=True, width=1000).rstrip()
    shift = ""
    if shift_reason:
        shift = (f"\nThe person's preference about this factor has just changed ({shift_reason}). "
                 "Let the story show the change.")
    resource_rule = resource_field = ""
    if ctx.with_resources:
        resource_rule = ('\n- "resource": if the request needs a document, code or data, write "[resource]" in both '
                         'requests and put its full text here; otherwise leave it empty.')
        resource_field = ' (and "resource")'
    messages = ctx.prompts.get("synthesis/sessions_generator").messages(
        ctx.system_role("session_writer"), n_sessions=n_sessions, user_persona=persona_description,
        series_structure=earlier_scenarios(earlier), session_number=session_number, context_factors=block,
        shift_note=shift, resource_rule=resource_rule, resource_field=resource_field,
        first_factor=factor["factor"], second_factor=factor.get("related_factor", "N/A"))
    return await generate(ctx, "session_writer", "session", messages, session_schema(ctx.with_resources),
                          build_session(preference, task_type, ctx.with_resources))


# ---------------------------------------------------------------------------------------------
# checklists


def checklist_schema(max_items: int) -> dict:
    """The checklist alone: an 'analysis' field costs a tiny model ~100 tokens per preference."""
    return {"type": "object",
            "properties": {"checklist": {"type": "array", "items": _string(10, 160), "minItems": 1,
                                         "maxItems": max_items}},
            "required": ["checklist"]}


def build_checklist(max_items: int) -> Callable[[Any], list[str]]:
    def build(data: Any) -> list[str]:
        items = data.get("checklist") if isinstance(data, dict) else data
        if not isinstance(items, list) or not items:
            raise Invalid(["'checklist' must be a non-empty list of questions"])
        cleaned = [" ".join(str(x).split()) for x in items if isinstance(x, str) and x.strip()]
        cleaned = list(dict.fromkeys(cleaned))[:max_items]
        if not cleaned or any(len(x) < 8 for x in cleaned):
            raise Invalid(["every checklist entry must be a yes/no question"])
        return cleaned

    return build


async def decompose(ctx: SynthContext, preference: str) -> list[str]:
    messages = ctx.prompts.get("synthesis/preference_decomposer").messages(
        ctx.system_role("decomposer"), preferences=preference)
    return await generate(ctx, "decomposer", "decompose", messages, checklist_schema(ctx.max_checklist_items),
                          build_checklist(ctx.max_checklist_items))


# ---------------------------------------------------------------------------------------------
# dialogues


def user_sim_schema(n_items: int) -> dict:
    return {"type": "object", "properties": {
        "evaluation": _string(10, 200),
        "score": {"type": "integer", "enum": list(range(1, 11))},
        "selected_items": {"type": "array", "maxItems": n_items,
                           "items": {"type": "integer", "enum": list(range(1, n_items + 1))}},
        "message": _string(5, 250)},
        "required": ["evaluation", "score", "selected_items", "message"]}


def build_user_turn(n_items: int) -> Callable[[Any], dict[str, Any]]:
    def build(data: Any) -> dict[str, Any]:
        score = data["score"]
        if isinstance(score, str):
            score = int(re.sub(r"[^\d].*$", "", score.strip()) or "0")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not 1 <= score <= 10:
            raise Invalid(["'score' must be a whole number from 1 to 10"])
        items = [int(i) for i in data.get("selected_items") or [] if str(i).isdigit() and 1 <= int(i) <= n_items]
        message = _text(data, "message")
        if len(message) < 2:
            raise Invalid(["'message' must not be empty"])
        return {"evaluation": _text(data, "evaluation"), "score": int(score), "selected_items": items,
                "message": message}

    return build


OPENING = "(The conversation starts. Send your request to the AI assistant.)"


def simulator_view(dialogue: Sequence[Mapping[str, str]]) -> Messages:
    """The dialogue from the user simulator's side: roles flipped, opened by a user turn."""
    flipped = [{"role": "assistant" if m["role"] == "user" else "user", "content": m["content"]} for m in dialogue]
    return [{"role": "user", "content": OPENING}, *flipped]


async def simulate_dialogue(ctx: SynthContext, *, persona_description: str, factor: str, preference: str,
                            checklist: Sequence[str], request: str, attempt: int = 0) -> dict[str, Any]:
    """User simulator vs assistant simulator until a score of 10 or ``max_turns`` assistant replies.

    The dialogue starts with the user's request; when the user simulator gives 10 its closing
    message ends the dialogue (``is_satisfied``); otherwise it ends with the last assistant reply.
    """
    take = f"\n\n(Conversation {attempt + 1}.)" if attempt else ""
    assistant_system = ctx.prompts.get("synthesis/assistant_simulator").system.format() + take
    user_system = ctx.prompts.get("synthesis/user_simulator").system.format(
        user_profile=persona_description, context_factor=factor, preference=preference,
        checklist=numbered(checklist)) + take
    assistant = ctx.clients["assistant_simulator"]
    a_role, u_role = ctx.system_role("assistant_simulator"), ctx.system_role("user_simulator")
    dialogue: list[dict[str, str]] = [{"role": "user", "content": request}]
    turns: list[dict[str, Any]] = []
    satisfied, error = False, None
    for turn in range(ctx.max_turns):
        try:
            reply = await assistant.complete([{"role": a_role, "content": assistant_system}, *dialogue],
                                             step="assistant_simulator", params=attempt_params(assistant, attempt))
        except ProviderError as exc:
            ctx.fail("assistant_simulator", exc.kind)
            raise StepFailed("assistant_simulator", exc.kind, str(exc)) from exc
        text = reply.text.strip()
        if not text:
            ctx.fail("assistant_simulator", "empty")
            text = "(no answer)"
        dialogue.append({"role": "assistant", "content": text})
        try:
            judged = await generate(ctx, "user_simulator", "user_simulator",
                                    [{"role": u_role, "content": user_system}, *simulator_view(dialogue)],
                                    user_sim_schema(len(checklist)), build_user_turn(len(checklist)))
        except StepFailed as exc:
            error = str(exc)
            break
        turns.append(judged)
        if judged["score"] == 10:
            dialogue.append({"role": "user", "content": judged["message"]})
            satisfied = True
            break
        if turn < ctx.max_turns - 1:
            dialogue.append({"role": "user", "content": judged["message"]})
    return {"dialogue": dialogue, "is_satisfied": satisfied, "scores": [t["score"] for t in turns],
            "evaluations": turns, "attempt": attempt, "error": error}


# ---------------------------------------------------------------------------------------------
# validation (paper App. E, Fig. 20)


def expression_schema(n_items: int) -> dict:
    item = {"type": "object", "properties": {"index": {"type": "integer", "enum": list(range(1, n_items + 1))},
                                             "evidence": {"type": "string", "maxLength": 100},
                                             "expressed": {"type": "boolean"}},
            "required": ["index", "evidence", "expressed"]}
    return {"type": "object", "properties": {"results": {"type": "array", "items": item, "minItems": n_items,
                                                         "maxItems": n_items}}, "required": ["results"]}


def build_expression(n_items: int) -> Callable[[Any], list[bool]]:
    def build(data: Any) -> list[bool]:
        results = data["results"] if isinstance(data, dict) else data
        if not isinstance(results, list) or len(results) != n_items:
            raise Invalid([f"give exactly {n_items} results, one per checklist question"])
        flags = []
        for r in results:
            value = r["expressed"] if isinstance(r, dict) else r
            if isinstance(value, str) and value.strip().lower() in ("true", "yes", "false", "no"):
                value = value.strip().lower() in ("true", "yes")
            if not isinstance(value, bool):
                raise Invalid(["'expressed' must be true or false"])
            flags.append(value)
        return flags

    return build


async def check_expressed(ctx: SynthContext, checklist: Sequence[str], user_messages: Sequence[str],
                          step: str) -> list[bool]:
    """Which checklist questions the user's messages express (one flag per question)."""
    messages = ctx.prompts.get("synthesis/expression_validator").messages(
        ctx.system_role("validator"), checklist=numbered(checklist),
        user_messages="\n".join(f"- {m}" for m in user_messages) or "(none)")
    return await generate(ctx, "validator", step, messages, expression_schema(len(checklist)),
                          build_expression(len(checklist)))
