"""What litellm's model map says of a configured model, read at planning so a misspelt or retired id is said once. Only
the exact id counts as known (``get_model_info`` falls back to near names)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Iterable

from cupid_exp.config import ModelConfig


@dataclass(frozen=True)
class MapEntry:
    """litellm's entry for one model id (its fields as litellm names them)."""

    key: str
    max_input_tokens: int | None
    input_cost_per_token: float | None
    output_cost_per_token: float | None
    deprecation_date: str | None  #: "YYYY-MM-DD" where litellm records one

    @property
    def priced(self) -> bool:
        return self.input_cost_per_token is not None and self.output_cost_per_token is not None


def map_entry(litellm_model: str) -> MapEntry | None:
    """litellm's entry for exactly this "<provider>/<model>" id; None when the map lacks it."""
    import litellm

    litellm.suppress_debug_info = True  # an unmapped id otherwise prints litellm's provider list
    provider, _, name = litellm_model.partition("/")
    try:
        info = litellm.get_model_info(model=name, custom_llm_provider=provider)
    except Exception:  # noqa: BLE001 - litellm raises several types (and plain Exception) for "not mapped"
        return None
    key = info.get("key")
    if key not in (litellm_model, name):  # a near-name fallback, not this id
        return None
    raw = litellm.model_cost.get(key) or {}
    return MapEntry(key=key, max_input_tokens=info.get("max_input_tokens"),
                    input_cost_per_token=info.get("input_cost_per_token"),
                    output_cost_per_token=info.get("output_cost_per_token"),
                    deprecation_date=raw.get("deprecation_date"))


def _past(date: str | None, today: dt.date) -> bool:
    try:
        return date is not None and dt.date.fromisoformat(date) <= today
    except ValueError:
        return False


UNKNOWN = "not in litellm's model map (likely misspelt or retired by its provider)"
UNPRICED = ("unpriced: its cost will read as unknown (set model_info.input_cost_per_token and "
            "model_info.output_cost_per_token)")


def model_note(model: ModelConfig, roles: Iterable[str], today: dt.date | None = None) -> tuple[str, str] | None:
    """One line and its level for a model the map cannot vouch for (``api_base``: only a missing price); else None."""
    if model.is_embedded:
        return None
    who = f"{', '.join(roles)} ({model.name}, {model.litellm_model})"
    entry = map_entry(model.litellm_model)
    priced = model.model_info.priced or entry is not None and entry.priced
    if model.api_base:
        return None if priced else ("info", f"{who} at {model.api_base}: a self-hosted endpoint; {UNPRICED}")
    problems = []
    if entry is None:
        problems.append(UNKNOWN)
    elif _past(entry.deprecation_date, today or dt.date.today()):
        problems.append(f"litellm's map gives its deprecation date as {entry.deprecation_date}: "
                        "the provider may no longer serve it")
    if not priced:
        problems.append(UNPRICED)
    elif entry is None:
        problems.append("priced by its config")
    return ("warning", f"{who}: " + "; ".join(problems)) if problems else None
