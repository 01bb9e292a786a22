"""What every synthesis step shares: its context, the one way it asks a model, and reply-shape helpers.

Each step asks for JSON under a schema (constrained decoding where the model supports it) through
the shared ``llm.steps.ask`` with ``Resample``: a reply that does not parse (``ParseError``) or
breaks a rule (``Invalid``) is asked for again with the attempt number, the reason and a moved seed,
up to ``synthesis.max_retries`` times; then the step fails (``StepFailed``), counted by the shared
``UsageMeter``. Builders check the JSON's shape themselves and raise ``ParseError`` for a wrong one,
so any other exception escaping a builder is a bug and stops the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from cupid_exp.llm.client import LLMClient
from cupid_exp.llm.replies import Invalid, ParseError, parse_json_reply, text_field
from cupid_exp.llm.steps import Messages, Resample, Transcript, ask
from cupid_exp.prompts import PromptSet
from cupid_exp.synthesis.steps.checks import placeholders


@dataclass
class SynthContext:
    """The role clients, prompts and recipe knobs every step reads."""

    clients: Mapping[str, LLMClient]  # role -> client (roles on one model share one client)
    prompts: PromptSet
    max_retries: int = 2
    max_turns: int = 4
    max_checklist_items: int = 4
    with_resources: bool = False

    @property
    def retry(self) -> Resample:
        return Resample(self.max_retries)

    def system_role(self, role: str) -> str:
        return self.clients[role].model.system_role

    async def ask_json(self, role: str, step: str, messages: Messages, schema: dict,
                       build: Callable[[Any], Any]) -> Any:
        """Ask ``role`` for JSON and return ``build(data)``; StepFailed when no attempt gives a valid artefact.

        The transcript is thrown away: the journey file is synthesis's record of what each step made.
        """
        return await ask(self.clients[role], step, messages, lambda text: build(reply_json(text)),
                         transcript=Transcript(), schema=schema, retry=self.retry)


def reply_json(text: str) -> Any:
    """The reply's JSON, refused when it still holds the prompt's template placeholders."""
    data = parse_json_reply(text)
    found = placeholders(data)
    if found:
        raise Invalid(f"replace the template placeholders {found[:3]} with real text")
    return data


def as_object(value: Any, what: str) -> dict[str, Any]:
    """``value`` when it is a JSON object; ParseError otherwise (a list, a string, null)."""
    if not isinstance(value, dict):
        raise ParseError(f"the {what} must be a JSON object, not {type(value).__name__}")
    return value


def text(data: Mapping[str, Any], key: str, what: str) -> str:
    """A non-empty string field of a reply object, its whitespace collapsed."""
    return " ".join(text_field(dict(data), key, what).split())


def string_schema(min_len: int, max_len: int) -> dict:
    return {"type": "string", "minLength": min_len, "maxLength": max_len}
