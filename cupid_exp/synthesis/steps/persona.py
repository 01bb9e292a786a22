"""Step 1 (paper B.2): a persona description and occupation written from a code-sampled template."""

from __future__ import annotations

import re

from cupid_exp.llm.replies import Invalid
from cupid_exp.synthesis.steps.base import SynthContext, as_object, string_schema, text

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
