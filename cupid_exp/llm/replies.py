"""What every reply parser shares: a parser returns a value or raises ``ParseError``; never guesses."""

from __future__ import annotations

import json
import re
from typing import Any

_THINK = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.DOTALL | re.IGNORECASE)


class ParseError(ValueError):
    """A reply that does not have the required shape; ``kind`` is how the failure is counted."""

    kind = "unparseable"


class Invalid(ParseError):
    """A reply that parsed but breaks a rule; the message lists what to fix."""

    kind = "invalid"

    def __init__(self, problems: list[str] | tuple[str, ...] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


def excerpt(text: str, n: int = 120) -> str:
    flat = " ".join((text or "").split())
    return repr(flat if len(flat) <= n else flat[: n - 1] + "…")


def strip_thinking(text: str) -> str:
    """Drop <think>…</think> blocks, and an unterminated leading one that ends at '</think>'."""
    text = _THINK.sub("", text or "")
    if "</think>" in text.lower():  # a reply whose opening tag was eaten by the chat template
        text = re.split(r"</think>", text, flags=re.IGNORECASE)[-1]
    return text.strip()


def parse_json_reply(text: str) -> Any:
    """JSON from a ```json fence, a bare value, or the outermost {...} / [...] (non-strict: raw newlines)."""
    text = strip_thinking(text)
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    candidates = [fenced.group(1)] if fenced else []
    candidates.append(text)
    for opener, closer in ("{}", "[]"):
        start, end = text.find(opener), text.rfind(closer)
        if 0 <= start < end:
            candidates.append(text[start: end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate.strip(), strict=False)
        except json.JSONDecodeError:
            continue
    raise ParseError(f"no JSON object found in reply: {excerpt(text)}")


def counted_list(text: str, key: str, n_items: int, what: str, unit: str) -> list[Any]:
    """The list under ``key`` (or a bare list) with exactly ``n_items`` items."""
    data = parse_json_reply(text)
    items = data.get(key) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ParseError(f"{what} reply has no {key!r} list")
    if len(items) != n_items:
        raise ParseError(f"{what} reply has {len(items)} {key} for {n_items} {unit}")
    return items


def text_field(data: dict[str, Any], key: str, what: str) -> str:
    """A non-empty string under ``key`` of a parsed reply."""
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ParseError(f"{what} reply has no text under {key!r}")
    return value.strip()


def string_list(value: object, key: str) -> list[str]:
    """A list of non-empty strings (a single string is taken as a one-item list)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
        raise ParseError(f"{key!r} is not a list of strings")
    return [str(v).strip() for v in value if str(v).strip()]
