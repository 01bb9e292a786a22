"""Checklist evaluation (paper §2.3): decompose a preference into yes/no items, then match items
against a preference, each labelled Fully (1) / Partially (0.5) / Not (0) covered.

Used by the inference task in both directions and by synthesis to decompose preferences.
"""

from __future__ import annotations

import json
import re
from typing import Any

from cupid_exp.llm.dry_run import PLACEHOLDER
from cupid_exp.llm.replies import ParseError, excerpt, parse_json_reply

LABELS = ("Fully Covered", "Partially Covered", "Not Covered")
LABEL_SCORES = {"fully covered": 1.0, "partially covered": 0.5, "not covered": 0.0}

CHECKLIST_SCHEMA = {
    "type": "object",
    "properties": {"analysis": {"type": "string", "maxLength": 400},
                   "checklist": {"type": "array", "items": {"type": "string", "minLength": 5, "maxLength": 200},
                                 "minItems": 1, "maxItems": 4}},
    "required": ["analysis", "checklist"],
}


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


def label_score(label: Any) -> float:
    """Map a coverage label to 1 / 0.5 / 0, forgiving case and spacing; anything else is an error."""
    key = re.sub(r"[\s_-]+", " ", str(label)).strip().strip(".").lower()
    if key in LABEL_SCORES:
        return LABEL_SCORES[key]
    for short, score in (("fully", 1.0), ("partially", 0.5), ("not", 0.0)):
        if key == short:
            return score
    raise ParseError(f"unknown coverage label {label!r}")


def parse_match_labels(text: str, n_items: int) -> list[float]:
    """One score per checklist entry, from {'results': [...]} or a bare list (PrefMatcher); counts must agree."""
    data = parse_json_reply(text)
    results = data.get("results") if isinstance(data, dict) else data
    if not isinstance(results, list):
        raise ParseError("match reply has no 'results' list")
    if len(results) != n_items:
        raise ParseError(f"match reply has {len(results)} results for {n_items} checklist entries")
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
