"""What every synthesis step shares: its context, the one way it asks (``llm.steps.ask`` with ``Resample``), and
reply-shape helpers. Builders raise ``ParseError`` for a wrong shape; any other exception is a bug."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TypeVar

from cupid_exp.llm.client import LLMClient
from cupid_exp.llm.replies import Invalid, ParseError, parse_json_reply, text_field
from cupid_exp.llm.steps import Messages, Resample, Transcript, ask
from cupid_exp.prompts import PromptSet
from cupid_exp.synthesis.steps.checks import placeholders

T = TypeVar("T")


@dataclass(frozen=True)
class WarmerResample(Resample):
    """``Resample`` whose retries also sample hotter (``temperature + step * attempt``, at most ``ceiling``): a moved
    seed alone changes little for a peaked tiny model and nothing at temperature 0."""

    step: float = 0.3
    ceiling: float = 1.3
    embedded_sampling: Mapping[str, float] = field(default_factory=dict)  #: every attempt, embedded models only

    def params(self, client: LLMClient, attempt: int) -> dict[str, Any] | None:
        out = dict(self.embedded_sampling) if client.model.is_embedded else {}
        moved = super().params(client, attempt)
        if moved is not None:
            base = float(client.model.params.get("temperature") or 0.0)
            out.update(moved, temperature=round(max(base, min(self.ceiling, base + self.step * attempt)), 2))
        return out or None


@dataclass
class SynthContext:
    """The role clients, prompts and recipe knobs every step reads."""

    clients: Mapping[str, LLMClient]  # role -> client (roles on one model share one client)
    prompts: PromptSet
    max_retries: int = 2
    max_turns: int = 4
    max_checklist_items: int = 4
    with_resources: bool = False
    embedded_sampling: Mapping[str, float] = field(default_factory=dict)

    @property
    def retry(self) -> Resample:
        return WarmerResample(self.max_retries, embedded_sampling=self.embedded_sampling)

    def system_role(self, role: str) -> str:
        return self.clients[role].model.system_role

    async def ask_json(self, role: str, step: str, messages: Messages, schema: dict,
                       build: Callable[[object], T]) -> T:
        """``build(data)`` of ``role``'s JSON reply; StepFailed when no attempt is valid."""
        return await ask(self.clients[role], step, messages, lambda text: build(reply_json(text)),
                         transcript=Transcript(), schema=schema, retry=self.retry)


# The retry note carries the reason: quoting the copied placeholders there ("<question 1>") only shows a
# tiny model the bait again (seed 1 on SmolLM2-135M copied them into four retries in a row).
PLACEHOLDER_REASON = "write real text of your own instead of copying the template placeholders in angle brackets"


def reply_json(text: str) -> object:
    """The reply's JSON, refused when it still holds the prompt's template placeholders."""
    data = parse_json_reply(text)
    if placeholders(data):
        raise Invalid(PLACEHOLDER_REASON)
    return data


def as_object(value: object, what: str) -> dict[str, Any]:
    """``value`` when it is a JSON object; ParseError otherwise (a list, a string, null)."""
    if not isinstance(value, dict):
        raise ParseError(f"the {what} must be a JSON object, not {type(value).__name__}")
    return value


def text(data: Mapping[str, Any], key: str, what: str) -> str:
    """A non-empty string field of a reply object, its whitespace collapsed."""
    return " ".join(text_field(dict(data), key, what).split())


def string_schema(min_len: int, max_len: int) -> dict:
    return {"type": "string", "minLength": min_len, "maxLength": max_len}
