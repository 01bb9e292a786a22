"""The generation judge (paper §2.3): a 1–10 score of a response against the true preference and checklist, kept exactly
as written (upstream truncated 7.5 to 7); no usable score is a ParseError, never 0."""

from __future__ import annotations

import re

from cupid_exp.llm.dry_run import PLACEHOLDER
from cupid_exp.llm.replies import ParseError, excerpt, parse_json_reply, strip_thinking

JUDGE_SCHEMA = {
    "type": "object",
    "properties": {"evaluation": {"type": "string", "maxLength": 800},
                   "score": {"type": "integer", "minimum": 1, "maximum": 10}},
    "required": ["evaluation", "score"],
}

# "### Evaluation Score", "**Evaluation Score:**", "### Evaluation Score (1-10)": the header and any
# "(1-10)" / "(out of 10)" scale note on its line, so the scale's "1" is never read as the score.
_SCORE_HEADER = re.compile(
    r"^[ \t>]*(?:#{1,6}[ \t]*)?(?:\*\*|__)?[ \t]*evaluation[ \t]+score[ \t]*(?:\*\*|__)?[ \t]*"
    r"(?:\((?:[^()\n]*\b10\b[^()\n]*)\))?[ \t]*(?:\*\*|__)?[ \t]*:?[ \t]*(?:\*\*|__)?",
    re.IGNORECASE | re.MULTILINE)
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?:\s*(?:/|out of)\s*10)?")


def parse_judge_score(text: str, low: float = 1.0, high: float = 10.0) -> float:
    """The score from JSON or after the last 'Evaluation Score' header; missing or out of range: ParseError."""
    body = strip_thinking(text)
    score: object = None
    if body.lstrip().startswith(("{", "```")):
        try:
            data = parse_json_reply(body)
            score = data.get("score") if isinstance(data, dict) else None
        except ParseError:
            score = None
    if score is None:
        headers = list(_SCORE_HEADER.finditer(body))
        if not headers:
            raise ParseError(f"no 'Evaluation Score' section in judgment: {excerpt(body)}")
        found = _NUMBER.search(body[headers[-1].end():])
        if not found:
            raise ParseError(f"no number under 'Evaluation Score': {excerpt(body[headers[-1].end():])}")
        score = found.group(1)
    try:
        value = float(score)
    except (TypeError, ValueError) as exc:
        raise ParseError(f"score {score!r} is not a number") from exc
    if not low <= value <= high:
        raise ParseError(f"score {value:g} is outside {low:g}–{high:g}")
    return value


def dry_judgment(messages: list[dict]) -> str:
    return f"### Evaluation of AI Assistant's Response\n\n{PLACEHOLDER}\n\n### Evaluation Score\n\n5"
