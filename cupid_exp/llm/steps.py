"""One model step, used by evaluation and synthesis alike: ask → parse → ask again → fail (counted).

``ask`` sends the messages, hands the reply to the step's parser and, when the parser raises
``ParseError``, tries again as the step's ``retry`` policy says: ``Reask`` shows the model its own
reply and the reason (evaluation), ``Resample`` asks afresh with the attempt number, the reason and
a moved sampling seed (synthesis, where a tiny model otherwise repeats itself). A provider failure
or a reply that never parses becomes ``StepFailed`` with its kind; anything else is a bug and
propagates. Every reply, usage and failure lands in the instance's ``Transcript``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from cupid_exp.llm.client import DryReply, LLMClient, ProviderError
from cupid_exp.llm.replies import ParseError
from cupid_exp.llm.usage import Completion
from cupid_exp.results import StepError

Messages = list[dict[str, str]]


class StepFailed(Exception):
    """A step that could not produce a usable value; recorded on the instance, never scored as 0."""

    def __init__(self, step: str, kind: str, message: str):
        self.step, self.kind = step, kind
        super().__init__(f"{step}: {kind}: {message}")

    def as_error(self) -> StepError:
        return StepError(self.step, self.kind, str(self))


@dataclass
class Transcript:
    """One instance's model calls: raw replies and usage per step, and the steps that failed."""

    raw: dict[str, list[str]] = field(default_factory=dict)
    usage: dict[str, dict[str, float]] = field(default_factory=dict)
    errors: list[StepError] = field(default_factory=list)

    def add(self, step: str, completion: Completion) -> None:
        usage = self.usage.setdefault(step, {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0})
        usage["calls"] += 1
        usage["prompt_tokens"] += completion.prompt_tokens
        usage["completion_tokens"] += completion.completion_tokens
        self.raw.setdefault(step, []).append(completion.text)

    def fail(self, exc: StepFailed) -> None:
        self.errors.append(exc.as_error())


@dataclass(frozen=True)
class Reask:
    """Evaluation's policy: on an unusable reply, show the model its reply and why, then ask again."""

    attempts: int = 1  #: extra attempts after the first

    def messages(self, original: Messages, attempt: int, reply: str, reason: str) -> Messages:
        if attempt == 0:
            return list(original)
        return [*original, {"role": "assistant", "content": reply},
                {"role": "user", "content": f"Your reply could not be used ({reason}). "
                                            "Answer again, exactly in the required format."}]

    def params(self, client: LLMClient, attempt: int) -> dict[str, Any] | None:
        return None


@dataclass(frozen=True)
class Resample:
    """Synthesis's policy: ask afresh, saying which attempt it is and what was wrong, with a moved seed.

    The note changes the cache key and the seed changes the sample: a tiny model otherwise repeats the
    rejected answer almost word for word.
    """

    attempts: int = 2

    def messages(self, original: Messages, attempt: int, reply: str, reason: str) -> Messages:
        if attempt == 0:
            return list(original)
        last = dict(original[-1])
        note = f"(Attempt {attempt + 1}. The previous answer was rejected: {reason[:300]}. Write a new answer.)"
        last["content"] = f"{last['content']}\n\n{note}"
        return [*original[:-1], last]

    def params(self, client: LLMClient, attempt: int) -> dict[str, Any] | None:
        return None if attempt == 0 else {"seed": int(client.model.params.get("seed") or 0) + attempt}


async def ask(client: LLMClient, step: str, messages: Messages, parse: Callable[[str], Any], *,
              transcript: Transcript, schema: dict | None = None, params: dict[str, Any] | None = None,
              retry: Reask | Resample = Reask(1), dry_reply: DryReply | None = None) -> Any:
    """Ask ``client`` for ``step`` and return ``parse(reply)``; raise StepFailed when no reply is usable.

    A reply cut at max_tokens (finish_reason "length") fails the step as ``length`` at once, its raw
    text kept: asking again would hit the same limit.
    """
    reply, reason, kind = "", "", "unparseable"
    for attempt in range(retry.attempts + 1):
        extra = retry.params(client, attempt)
        try:
            completion = await client.complete(retry.messages(messages, attempt, reply, reason), step=step,
                                               json_schema=schema, params={**(params or {}), **(extra or {})},
                                               dry_reply=dry_reply)
        except ProviderError as exc:
            raise StepFailed(step, exc.kind, str(exc)) from exc
        transcript.add(step, completion)
        reply = completion.text
        try:
            return parse(reply)
        except ParseError as exc:
            if completion.finish_reason == "length":
                client.meter.reject(step, "length")
                raise StepFailed(step, "length", f"the reply was cut at max_tokens ({exc})") from exc
            kind, reason = exc.kind, str(exc)
            client.meter.reject(step, kind)
    client.meter.gave_up(step)
    raise StepFailed(step, kind, reason)
