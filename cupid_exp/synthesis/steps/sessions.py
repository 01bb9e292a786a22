"""Step 3 (paper B.3): one session scenario per journey slot, its request with and without the preference."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from cupid_exp.llm.replies import Invalid, ParseError
from cupid_exp.synthesis.steps.base import SynthContext, as_object, string_schema, text
from cupid_exp.synthesis.steps.checks import contains_text, overlap, same_text


def session_schema(with_resources: bool) -> dict:
    props: dict[str, Any] = {"story": string_schema(40, 300), "request_with_preference": string_schema(30, 250),
                             "request": string_schema(20, 250)}
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
    if same_text(request, with_pref):
        problems.append("'request' must leave out the preference that 'request_with_preference' states")
    if contains_text(request, preference) or overlap(preference, request) >= 0.6:
        problems.append("'request' reveals the preference; remove every hint of it")
    if "[resource]" in request and not (with_resources and session.get("resource", "").strip()):
        problems.append("'request' refers to [resource] but no resource was written")
    return problems


def build_session(preference: str, task_type: str, with_resources: bool) -> Callable[[object], dict]:
    def build(data: object) -> dict[str, Any]:
        item = as_object(data, "session")
        session = {"task_type": task_type, "story": text(item, "story", "session"),
                   "request_with_preference": text(item, "request_with_preference", "session"),
                   "request": text(item, "request", "session")}
        if with_resources:
            resource = item.get("resource")
            if resource is not None and not isinstance(resource, str):
                raise ParseError(f"the session's 'resource' must be a string, not {type(resource).__name__}")
            session["resource"] = (resource or "").strip()
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


def earlier_scenarios(sessions: Sequence[Mapping[str, Any] | None], last: int = 2) -> str:
    done = [(i, s) for i, s in enumerate(sessions, start=1) if s]
    if not done:
        return "(none yet: this is the first scenario)"
    return "\n".join(f"- Scenario {i}: {s['story']}" for i, s in done[-last:])


async def write_session(ctx: SynthContext, *, persona_description: str, factor: Mapping[str, Any],
                        preference: str, task_type: str, session_number: int, n_sessions: int,
                        earlier: Sequence[Mapping[str, Any] | None], shift_reason: str | None) -> dict[str, Any]:
    import yaml

    block = yaml.dump({"context_factor": factor["factor"], "preference": preference, "task_type": task_type},
                      default_flow_style=False, sort_keys=False, allow_unicode=True, width=1000).rstrip()
    shift = (f"\nThe person's preference about this factor has just changed ({shift_reason}). "
             "Let the story show the change.") if shift_reason else ""
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
    return await ctx.ask_json("session_writer", "session", messages, session_schema(ctx.with_resources),
                              build_session(preference, task_type, ctx.with_resources))
