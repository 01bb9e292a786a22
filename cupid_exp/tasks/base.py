"""What every task shares: the evaluation context and one 'ask, parse, re-ask' step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from cupid_exp.llm.client import LLMClient, ProviderError
from cupid_exp.parsing import ParseError
from cupid_exp.prompts import PromptSet


@dataclass
class EvalContext:
    subject: LLMClient
    decomposer: LLMClient
    matcher: LLMClient
    judge: LLMClient
    prompts: PromptSet
    reask: int = 1
    matcher_prompt: str = "evaluation/preference_matcher"
    matcher_examples: str | None = ""  # rendered few-shot block for the matcher's {examples}
    max_checklist_items: int = 4
    summaries: dict[str, Any] = field(default_factory=dict)  # instance key -> summary task (shared by tasks)


class StepFailed(Exception):
    """A step that could not produce a usable value; recorded on the instance, never scored as 0."""

    def __init__(self, step: str, kind: str, message: str):
        self.step, self.kind = step, kind
        super().__init__(f"{step}: {kind}: {message}")


@dataclass
class InstanceRecord:
    """Everything known about one instance's run; one line of instances.jsonl."""

    key: str
    persona_id: str
    instance_type: str
    values: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, list[str]] = field(default_factory=dict)
    errors: list[dict[str, str]] = field(default_factory=list)
    usage: dict[str, dict[str, float]] = field(default_factory=dict)

    def add_error(self, exc: "StepFailed") -> None:
        self.errors.append({"step": exc.step, "kind": exc.kind, "message": str(exc)})

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "persona_id": self.persona_id, "instance_type": self.instance_type,
                **self.values, "errors": self.errors, "raw": self.raw, "usage": self.usage}


async def ask(ctx: EvalContext, client: LLMClient, record: InstanceRecord, step: str, messages: list[dict],
              parse: Callable[[str], Any], json_schema: dict | None = None,
              params: dict[str, Any] | None = None) -> Any:
    """Call the model, parse the reply, and on a parse failure re-ask up to ``ctx.reask`` times.

    A re-ask shows the model its own reply and the parse error. Raw replies are kept on
    the record; provider and parse failures raise StepFailed with their kind.
    """
    conversation = list(messages)
    last_error = ""
    for attempt in range(ctx.reask + 1):
        try:
            completion = await client.complete(conversation, step=step, json_schema=json_schema, params=params)
        except ProviderError as exc:
            raise StepFailed(step, exc.kind, str(exc)) from exc
        usage = record.usage.setdefault(step, {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0})
        usage["calls"] += 1
        usage["prompt_tokens"] += completion.prompt_tokens
        usage["completion_tokens"] += completion.completion_tokens
        record.raw.setdefault(step, []).append(completion.text)
        try:
            return parse(completion.text)
        except ParseError as exc:
            last_error = str(exc)
            client.meter.fail(step, "unparseable_attempt")
            conversation = [*messages, {"role": "assistant", "content": completion.text},
                            {"role": "user", "content": f"Your reply could not be used ({last_error}). "
                                                        "Answer again, exactly in the required format."}]
    raise StepFailed(step, "unparseable", last_error)
