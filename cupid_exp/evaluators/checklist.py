"""Checklist evaluation (paper §2.3): decompose a preference into yes/no items, then match items against a preference as
Fully (1) / Partially (0.5) / Not (0) covered. Synthesis uses ``decompose`` too."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Callable

from cupid_exp.llm.dry_run import PLACEHOLDER
from cupid_exp.llm.replies import ParseError, counted_list, excerpt, parse_json_reply
from cupid_exp.llm.steps import Reask, Resample, Transcript, ask

if TYPE_CHECKING:
    from cupid_exp.llm.client import LLMClient
    from cupid_exp.prompts import PromptSet

LABELS = ("Fully Covered", "Partially Covered", "Not Covered")
LABEL_SCORES = {"fully covered": 1.0, "partially covered": 0.5, "not covered": 0.0}

DECOMPOSER_PROMPT = "synthesis/preference_decomposer"


def checklist_schema(max_items: int = 4) -> dict:
    """The decomposer's reply: its analysis, then at most ``max_items`` checklist questions."""
    return {
        "type": "object",
        "properties": {"analysis": {"type": "string", "maxLength": 400},
                       "checklist": {"type": "array", "items": {"type": "string", "minLength": 5, "maxLength": 200},
                                     "minItems": 1, "maxItems": max_items}},
        "required": ["analysis", "checklist"],
    }


CHECKLIST_SCHEMA = checklist_schema()


def match_schema(n_items: int) -> dict:
    """One result per checklist entry, with a label from LABELS (constrained decoding on local models)."""
    item = {"type": "object",
            "properties": {"index": {"type": "integer"}, "entry": {"type": "string", "maxLength": 200},
                           "reasoning": {"type": "string", "maxLength": 240},
                           "label": {"type": "string", "enum": list(LABELS)}},
            "required": ["index", "entry", "reasoning", "label"]}
    return {"type": "object",
            "properties": {"results": {"type": "array", "items": item, "minItems": n_items, "maxItems": n_items}},
            "required": ["results"]}


def parse_checklist(text: str) -> list[str]:
    """The decomposer's {'checklist': [...]} (or a bare list) as a non-empty list of strings."""
    data = parse_json_reply(text)
    items = data.get("checklist") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise ParseError(f"'checklist' is not a non-empty list: {excerpt(json.dumps(data))}")
    cleaned = [str(item).strip() for item in items if isinstance(item, (str, int, float)) and str(item).strip()]
    if len(cleaned) != len(items):
        raise ParseError("'checklist' holds empty or non-text entries")
    return cleaned


async def decompose(client: LLMClient, prompts: PromptSet, preference: str, *, transcript: Transcript,
                    retry: Reask | Resample, max_items: int, parse: Callable[[str], list[str]] = parse_checklist
                    ) -> list[str]:
    """The preference as at most ``max_items`` yes/no items; synthesis passes a ``parse`` with its data checks."""
    messages = prompts.get(DECOMPOSER_PROMPT).messages(client.model.system_role, preferences=preference)
    items = await ask(client, "decompose", messages, parse, transcript=transcript, schema=checklist_schema(max_items),
                      retry=retry, dry_reply=dry_checklist)
    return items[:max_items]


def label_score(label: object) -> float:
    """Map a coverage label to 1 / 0.5 / 0, forgiving case and spacing; anything else is an error."""
    key = re.sub(r"[\s_-]+", " ", str(label)).strip().strip(".").lower()
    score = LABEL_SCORES.get(key, LABEL_SCORES.get(f"{key} covered"))  # "Fully" too
    if score is None:
        raise ParseError(f"unknown coverage label {label!r}")
    return score


def parse_match_labels(text: str, n_items: int) -> list[float]:
    """One score per checklist entry, from {'results': [...]} or a bare list (PrefMatcher); counts must agree."""
    results = counted_list(text, "results", n_items, "match", "checklist entries")
    scores = []
    for i, item in enumerate(results):
        label = item.get("label") if isinstance(item, dict) else item
        if label is None:
            raise ParseError(f"result {i + 1} has no 'label'")
        scores.append(label_score(label))
    return scores


def dry_checklist(messages: list[dict], n_items: int = 3) -> str:
    return json.dumps({"analysis": PLACEHOLDER,
                       "checklist": [f"Does the response follow {PLACEHOLDER} item {i + 1}?" for i in range(n_items)]})


def dry_match(n_items: int):
    def reply(messages: list[dict]) -> str:
        return json.dumps({"results": [{"index": i + 1, "entry": PLACEHOLDER, "reasoning": PLACEHOLDER,
                                        "label": "Partially Covered"} for i in range(n_items)]})
    return reply
