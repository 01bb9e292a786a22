"""Decoding parameters checked at planning: a wrong type or range in ``model.params`` fails in one line, not a paid
refusal; unknown keys pass unless a near miss (``temprature``). Imports nothing, so the config stays below ``llm``."""

from __future__ import annotations

import difflib
import math
from typing import Any, Callable, Mapping

Check = tuple[Callable[[Any], bool], str]  # (accepts the value, what is allowed)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _between(low: float, high: float) -> Check:
    return (lambda v: _number(v) and low <= v <= high, f"a number in [{low:g}, {high:g}]")


def _at_least(low: int) -> Check:
    return (lambda v: _integer(v) and v >= low, f"an integer >= {low}")


REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")
THINKING_MIN_BUDGET = 1024  # Anthropic's smallest thinking budget

CHECKS: dict[str, Check] = {
    "temperature": _between(0, 2),
    "top_p": (lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "top_k": (lambda v: _integer(v) and v >= -1, "an integer >= 1 (or 0 / -1: off, as llama.cpp and vLLM take it)"),
    "min_p": _between(0, 1),
    "max_tokens": _at_least(1),
    "max_completion_tokens": _at_least(1),
    "min_tokens": _at_least(0),
    "seed": (_integer, "an integer"),
    "n": (lambda v: v == 1 and _integer(v), "1 (the runner reads one choice; more would be paid and thrown away)"),
    "presence_penalty": _between(-2, 2),
    "frequency_penalty": _between(-2, 2),
    "repetition_penalty": (lambda v: _number(v) and v > 0, "a number > 0"),
    "stop": (lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)),
             "a string or a list of strings"),
    "logprobs": (lambda v: isinstance(v, bool), "true or false"),
    "top_logprobs": (lambda v: _integer(v) and 0 <= v <= 20, "an integer in [0, 20]"),
    "logit_bias": (lambda v: isinstance(v, Mapping) and all(_number(b) and -100 <= b <= 100 for b in v.values()),
                   "a mapping of token id to a number in [-100, 100]"),
    "stream": (lambda v: v is False, "false (the runner reads whole replies)"),
    "reasoning_effort": (lambda v: v in REASONING_EFFORTS, f"one of {', '.join(REASONING_EFFORTS)}"),
    "user": (lambda v: isinstance(v, str), "a string"),
}


def _thinking(value: object, params: Mapping[str, Any]) -> str | None:
    """Anthropic's extended thinking: {type: enabled, budget_tokens: >= 1024 and < max_tokens} or {type: disabled}."""
    if not isinstance(value, Mapping) or value.get("type") not in ("enabled", "disabled"):
        return "{type: enabled, budget_tokens: N} or {type: disabled}"
    if value["type"] == "disabled":
        return None
    budget, cap = value.get("budget_tokens"), params.get("max_tokens")
    if not _integer(budget) or budget < THINKING_MIN_BUDGET:
        return f"budget_tokens an integer >= {THINKING_MIN_BUDGET}"
    return f"budget_tokens below max_tokens ({cap})" if _integer(cap) and budget >= cap else None


def param_problem(key: str, value: object, params: Mapping[str, Any]) -> str | None:
    """What is allowed for ``key`` when ``value`` is not; None when the value is fine or the key is not checked."""
    if key == "thinking":
        return _thinking(value, params)
    check = CHECKS.get(key)
    if check is None:
        close = difflib.get_close_matches(key, [*CHECKS, "thinking"], n=1, cutoff=0.85)
        return f"not a decoding parameter; did you mean {close[0]}?" if close else None
    accepts, allowed = check
    return None if accepts(value) else allowed
