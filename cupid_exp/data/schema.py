"""The CUPID instance schema and its row validator: one bad row is reported by key and field, the rest still run."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Mapping

INSTANCE_TYPES = ("consistent", "contrastive", "changing")
ROLES = ("user", "assistant")


class DataError(ValueError):
    """A row that does not fit the CUPID schema; the message names row, key and field."""

    def __init__(self, where: str, field: str, problem: str):
        self.where, self.field, self.problem = where, field, problem
        super().__init__(f"{where}: field '{field}' {problem}")


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class PriorSession:
    context_factor: str
    contextual_preference: str
    dialogue: tuple[Message, ...]


@dataclass(frozen=True)
class Instance:
    persona_id: str
    instance_type: str
    current_request: str
    current_context_factor: str
    current_contextual_preference: str
    current_checklist: tuple[str, ...]
    prior_interactions: tuple[PriorSession, ...]

    @property
    def key(self) -> str:
        """Unique row key. persona_id alone repeats 3x in CUPID (upstream's collision)."""
        return f"{self.persona_id}/{self.instance_type}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def normalize_text(text: str) -> str:
    """Collapse whitespace and drop one trailing period, for label comparisons."""
    return re.sub(r"\s+", " ", text).strip().removesuffix(".").strip()


def relevant_positions(instance: Instance) -> list[int]:
    """1-based positions of the oracle sessions (sharing the current context factor and preference)."""
    factor = normalize_text(instance.current_context_factor)
    preference = normalize_text(instance.current_contextual_preference)
    return [i for i, s in enumerate(instance.prior_interactions, start=1)
            if normalize_text(s.context_factor) == factor and normalize_text(s.contextual_preference) == preference]


def _text(row: Mapping[str, Any], key: str, where: str, *, label: str | None = None,
          allow_empty: bool = False) -> str:
    field, value = label or key, row.get(key)
    if value is None:
        raise DataError(where, field, "is missing")
    if not isinstance(value, str):
        raise DataError(where, field, f"must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise DataError(where, field, "is empty")
    return value


def _list(row: Mapping[str, Any], key: str, where: str, *, label: str | None = None) -> list:
    field, value = label or key, row.get(key)
    if value is None:
        raise DataError(where, field, "is missing")
    if not isinstance(value, (list, tuple)):  # parquet's and the Hub's arrays are lists by now (loading._plain)
        raise DataError(where, field, f"must be a list, got {type(value).__name__}")
    if not value:
        raise DataError(where, field, "is an empty list")
    return list(value)


def _dialogue(raw: Mapping[str, Any], field: str, where: str) -> tuple[Message, ...]:
    turns = _list(raw, "dialogue", where, label=f"{field}.dialogue")
    messages = []
    for j, turn in enumerate(turns):
        turn_field = f"{field}.dialogue[{j}]"
        if not isinstance(turn, Mapping):
            raise DataError(where, turn_field, f"must be an object, got {type(turn).__name__}")
        role = _text(turn, "role", where, label=f"{turn_field}.role")
        if role not in ROLES:
            raise DataError(where, f"{turn_field}.role", f"is {role!r}; expected one of {ROLES}")
        messages.append(Message(role=role, content=_text(turn, "content", where, label=f"{turn_field}.content",
                                                          allow_empty=True)))
    if messages[0].role != "user":
        raise DataError(where, f"{field}.dialogue[0].role", "must be 'user' (a session starts with the user)")
    if not any(m.role == "assistant" for m in messages):
        raise DataError(where, f"{field}.dialogue", "has no assistant message")
    if not any(m.content.strip() for m in messages):
        raise DataError(where, f"{field}.dialogue", "has only empty turns (nothing for the model to read)")
    return tuple(messages)


def validate_row(row: object, where: str) -> Instance:
    """One raw row as an Instance, or DataError naming ``where`` (file and line or row index) and the field."""
    if not isinstance(row, Mapping):
        raise DataError(where, "<row>", f"must be an object, got {type(row).__name__}")
    persona_id = _text(row, "persona_id", where)
    instance_type = _text(row, "instance_type", where)
    if instance_type not in INSTANCE_TYPES:
        raise DataError(f"{where} [{persona_id}]", "instance_type",
                        f"is {instance_type!r}; expected one of {INSTANCE_TYPES}")
    where = f"{where} [{persona_id}/{instance_type}]"
    checklist = _list(row, "current_checklist", where)
    for i, item in enumerate(checklist):
        if not isinstance(item, str) or not item.strip():
            raise DataError(where, f"current_checklist[{i}]", "must be a non-empty string")
    priors = []
    for i, raw in enumerate(_list(row, "prior_interactions", where)):
        field = f"prior_interactions[{i}]"
        if not isinstance(raw, Mapping):
            raise DataError(where, field, f"must be an object, got {type(raw).__name__}")
        priors.append(PriorSession(
            context_factor=_text(raw, "context_factor", where, label=f"{field}.context_factor"),
            contextual_preference=_text(raw, "contextual_preference", where,
                                        label=f"{field}.contextual_preference"),
            dialogue=_dialogue(raw, field, where),
        ))
    return Instance(
        persona_id=persona_id,
        instance_type=instance_type,
        current_request=_text(row, "current_request", where),
        current_context_factor=_text(row, "current_context_factor", where),
        current_contextual_preference=_text(row, "current_contextual_preference", where),
        current_checklist=tuple(checklist),
        prior_interactions=tuple(priors),
    )
