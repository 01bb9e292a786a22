"""Parsers for model replies. Each returns a value or raises ParseError; none guesses a score."""

from __future__ import annotations

import json
import re
from typing import Any

LABEL_SCORES = {"fully covered": 1.0, "partially covered": 0.5, "not covered": 0.0}
_THINK = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.DOTALL | re.IGNORECASE)
_PREFERENCE_HEADER = re.compile(
    r"^[ \t>]*(?:#{1,6}[ \t]*)?(?:\*\*|__)?[ \t]*most[ \t]+likely[ \t]+prefer\w*[ \t]*(?:\*\*|__)?[ \t]*:?"
    r"[ \t]*(?:\*\*|__)?[ \t]*(?P<rest>.*)$",
    re.IGNORECASE | re.MULTILINE,
)
_HEADER_LINE = re.compile(r"^\s*#{1,6}\s")
_BOLD_LINE = re.compile(r"^\s*\*\*(?P<inner>[^*]+)\*\*\s*(?P<colon>:?)\s*$")


def _is_header(line: str) -> bool:
    """A markdown header, or a bold label line ('**Confidence:**', '**Notes**'); not a bolded sentence."""
    if _HEADER_LINE.match(line):
        return True
    bold = _BOLD_LINE.match(line)
    if not bold:
        return False
    inner = bold.group("inner").strip()
    return bool(bold.group("colon")) or inner.endswith(":") or len(inner.split()) <= 4


class ParseError(ValueError):
    """A reply that does not have the required shape."""


def strip_thinking(text: str) -> str:
    """Drop <think>…</think> blocks, and an unterminated leading one that ends at '</think>'."""
    text = _THINK.sub("", text or "")
    if "</think>" in text.lower():  # reply whose opening tag was eaten by the chat template
        text = re.split(r"</think>", text, flags=re.IGNORECASE)[-1]
    return text.strip()


def parse_json_reply(text: str) -> Any:
    """JSON from a ```json fence, a bare object, or the outermost {...} span of the reply."""
    text = strip_thinking(text)
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    candidates = [fenced.group(1)] if fenced else []
    candidates.append(text)
    for opener, closer in ("{}", "[]"):
        start, end = text.find(opener), text.rfind(closer)
        if 0 <= start < end:
            candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate.strip())
        except json.JSONDecodeError:
            continue
    raise ParseError(f"no JSON object found in reply: {_excerpt(text)}")


def _clean_sentence(text: str) -> str:
    text = text.strip().strip("*_").strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'“”":
        text = text[1:-1]
    return text.strip().strip("\"“”").strip()


def parse_preference(text: str) -> str:
    """The stated preference: JSON {'preference': ...} or the text under 'Most Likely Preference(s)'.

    Tolerates bold or plural headers, a same-line answer, and <think> blocks. Takes the
    first non-empty line after the header (the task asks for one sentence).
    """
    body = strip_thinking(text)
    if body.lstrip().startswith("{") or body.lstrip().startswith("```"):
        try:
            data = parse_json_reply(body)
        except ParseError:
            data = None
        if isinstance(data, dict):
            for key in ("preference", "most_likely_preference", "most_likely_preferences"):
                value = data.get(key)
                if isinstance(value, str) and value.strip():
                    return _clean_sentence(value)
    matches = list(_PREFERENCE_HEADER.finditer(body))
    if not matches:
        raise ParseError(f"no 'Most Likely Preference' section in reply: {_excerpt(body)}")
    match = matches[-1]
    rest = _clean_sentence(match.group("rest"))
    if rest:
        return rest
    for line in body[match.end():].splitlines():
        if _is_header(line):
            break
        line = _clean_sentence(line.lstrip("-*> \t"))
        if line:
            return line
    raise ParseError("the 'Most Likely Preference' section is empty")


def parse_checklist(text: str, max_items: int | None = None) -> list[str]:
    """The decomposer's {'checklist': [...]} as a non-empty list of strings."""
    data = parse_json_reply(text)
    items = data.get("checklist") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise ParseError(f"'checklist' is not a non-empty list: {_excerpt(json.dumps(data))}")
    cleaned = [str(item).strip() for item in items if isinstance(item, (str, int, float)) and str(item).strip()]
    if len(cleaned) != len(items):
        raise ParseError("'checklist' holds empty or non-text entries")
    return cleaned[:max_items] if max_items else cleaned


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
    """One score per checklist entry, from {'results': [...]} or a bare list; counts must agree."""
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


def _excerpt(text: str, n: int = 120) -> str:
    flat = " ".join((text or "").split())
    return repr(flat if len(flat) <= n else flat[: n - 1] + "…")


_SCORE_HEADER = re.compile(r"^[ \t>]*(?:#{1,6}[ \t]*)?(?:\*\*|__)?[ \t]*evaluation[ \t]+score[ \t]*(?:\*\*|__)?[ \t]*:?",
                           re.IGNORECASE | re.MULTILINE)
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?:\s*(?:/|out of)\s*10)?")


def parse_judge_score(text: str, low: float = 1.0, high: float = 10.0) -> float:
    """The judge's 1–10 score, exactly as written (7.5 stays 7.5; upstream truncated it to 7).

    Reads JSON {'score': ...} or the first number after the last 'Evaluation Score' header.
    A missing header, no number, or a number outside [low, high] is a ParseError, never 0.
    """
    body = strip_thinking(text)
    score: Any = None
    if body.lstrip().startswith(("{", "```")):
        try:
            data = parse_json_reply(body)
            score = data.get("score") if isinstance(data, dict) else None
        except ParseError:
            score = None
    if score is None:
        headers = list(_SCORE_HEADER.finditer(body))
        if not headers:
            raise ParseError(f"no 'Evaluation Score' section in judgment: {_excerpt(body)}")
        found = _NUMBER.search(body[headers[-1].end():])
        if not found:
            raise ParseError(f"no number under 'Evaluation Score': {_excerpt(body[headers[-1].end():])}")
        score = found.group(1)
    try:
        value = float(score)
    except (TypeError, ValueError) as exc:
        raise ParseError(f"score {score!r} is not a number") from exc
    if not low <= value <= high:
        raise ParseError(f"score {value:g} is outside {low:g}–{high:g}")
    return value


def parse_summaries(text: str, n_sessions: int) -> list[dict[str, Any]]:
    """The summariser's {'summaries': [...]}: one entry per session with context and preferences lists."""
    data = parse_json_reply(text)
    items = data.get("summaries") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ParseError("summary reply has no 'summaries' list")
    if len(items) != n_sessions:
        raise ParseError(f"summary reply has {len(items)} entries for {n_sessions} sessions")
    out = []
    for i, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            raise ParseError(f"summary {i} is not an object")
        context, prefs = item.get("context"), item.get("preferences")
        if isinstance(context, str):
            context = [context]
        if isinstance(prefs, str):
            prefs = [prefs]
        if not isinstance(context, list) or not isinstance(prefs, list):
            raise ParseError(f"summary {i} lacks 'context' or 'preferences' lists")
        out.append({"session_id": i, "context": [str(c).strip() for c in context if str(c).strip()],
                    "preferences": [str(p).strip() for p in prefs if str(p).strip()]})
    return out
