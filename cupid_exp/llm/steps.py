"""One model step, for evaluation and synthesis: ask → parse → ask again → fail as ``StepFailed`` (counted)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TypeVar

from cupid_exp.llm import calls
from cupid_exp.llm.client import DryReply, LLMClient
from cupid_exp.llm.errors import ProviderError
from cupid_exp.llm.replies import ParseError, excerpt
from cupid_exp.llm.usage import Completion
from cupid_exp.results import StepError

Messages = list[dict[str, str]]
_T = TypeVar("_T")
TRUNCATED, REFUSAL_KIND = "truncated", "content_filter"  #: how a cut reply and a refused one are counted


class StepFailed(Exception):
    """A step that could not produce a usable value; recorded on the instance, never scored as 0."""

    def __init__(self, step: str, kind: str, message: str):
        self.step, self.kind = step, kind
        super().__init__(f"{step}: {kind}: {message}")


@dataclass
class Transcript:
    """One instance's model calls: raw replies and usage per step, and the steps that failed."""

    raw: dict[str, list[str]] = field(default_factory=dict)
    usage: dict[str, dict[str, float]] = field(default_factory=dict)
    errors: list[StepError] = field(default_factory=list)

    def add(self, step: str, completion: Completion) -> None:
        usage = self.usage.setdefault(step, {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                             "cache_hits": 0, "cost_usd": 0.0})
        usage["calls"] += 1
        usage["prompt_tokens"] += completion.prompt_tokens
        usage["completion_tokens"] += completion.completion_tokens
        # kept per instance so a resumed job can count what its earlier attempts spent (as UsageMeter does)
        usage["cache_hits"] += int(completion.cached)
        if completion.cost_usd is not None and not completion.cached:
            usage["cost_usd"] += completion.cost_usd
        usage["cost_usd"] += completion.charged_usd  # its earlier attempts billed without a usable reply
        self.raw.setdefault(step, []).append(completion.text)

    def fail(self, exc: StepFailed) -> None:
        self.errors.append(StepError(exc.step, exc.kind, str(exc)))


@dataclass(frozen=True)
class Reask:
    """Evaluation's policy: on an unusable reply, show the model its reply and why, then ask again."""

    attempts: int = 1  #: extra attempts after the first

    def messages(self, original: Messages, attempt: int, reply: str, reason: str) -> Messages:
        return [*original, {"role": "assistant", "content": reply},
                {"role": "user", "content": f"Your reply could not be used ({reason}). "
                                            "Answer again, exactly in the required format."}]

    def params(self, client: LLMClient, attempt: int) -> dict[str, Any] | None:
        return None


@dataclass(frozen=True)
class Resample:
    """Synthesis's policy: ask afresh with the reason and a moved seed, or a tiny model repeats itself."""

    attempts: int = 2

    def messages(self, original: Messages, attempt: int, reply: str, reason: str) -> Messages:
        last = dict(original[-1])
        note = f"(Attempt {attempt + 1}. The previous answer was rejected: {reason[:300]}. Write a new answer.)"
        last["content"] = f"{last['content']}\n\n{note}"
        return [*original[:-1], last]

    def params(self, client: LLMClient, attempt: int) -> dict[str, Any] | None:
        return None if attempt == 0 else {"seed": int(client.model.params.get("seed") or 0) + attempt}


async def ask(client: LLMClient, step: str, messages: Messages, parse: Callable[[str], _T], *,
              transcript: Transcript, schema: dict[str, Any] | None = None, params: dict[str, Any] | None = None,
              retry: Reask | Resample = Reask(1), dry_reply: DryReply | None = None, keep_cut: bool = False) -> _T:
    """``parse(reply)`` of ``client``'s reply for ``step``; StepFailed when none is usable. A reply cut at max_tokens is
    asked again with more room, then fails ``truncated`` (kept as is with ``keep_cut``); a refusal fails at once."""
    reply, reason, kind = "", "", "unparseable"
    log = calls.current()
    attempt = requests = 0
    sent: Messages | None = None  # kept for the request sent again with a larger max_tokens
    longer: dict[str, int] | None = None  # that request's max_tokens; kept for the re-asks after it
    while attempt <= retry.attempts:
        extra = {**(params or {}), **(retry.params(client, attempt) or {})}
        if sent is None:
            sent = retry.messages(messages, attempt, reply, reason) if attempt else list(messages)
        started = time.time_ns() if log is not None else 0
        try:
            completion = await client.complete(sent, step=step, json_schema=schema, params={**extra, **(longer or {})},
                                               dry_reply=dry_reply)
        except ProviderError as exc:
            if log is not None:
                log.calls.append(_record(client, step, requests, sent, started,
                                         rejected=calls.Rejection(exc.kind, str(exc))))
            raise StepFailed(step, exc.kind, str(exc)) from exc
        transcript.add(step, completion)
        reply = completion.text
        record = _record(client, step, requests, sent, started, completion) if log is not None else None
        requests += 1
        if record is not None and log is not None:  # a record is made only with a log
            log.calls.append(record)
        if completion.refused and not reply.strip():
            raise _refused(client, step, completion, record)
        if completion.finish_reason == "length" and (keep_cut or client.model.keep_cut_replies):
            client.meter.kept_cut(step)
        elif completion.finish_reason == "length" and not completion.refused:
            client.meter.reject(step, TRUNCATED)
            retried, cut_at = longer is not None, _limit(client.reply_limit(step, {**extra, **(longer or {})}))
            if not retried and (longer := client.longer_reply(step, extra)) is not None:
                if record is not None:
                    record.rejected = calls.Rejection(TRUNCATED, f"cut at {cut_at}; sent again with {_limit(longer)}")
                continue
            why = (", sent again after a first cut" if retried else "" if cut_at.startswith("the provider")
                   else ", the longest reply the model gives")
            message = f"the reply was cut at {cut_at}{why}: {excerpt(reply)}"
            if record is not None:
                record.rejected = calls.Rejection(TRUNCATED, message)
            raise StepFailed(step, TRUNCATED, message)
        try:
            return parse(reply)
        except ParseError as exc:
            if completion.refused:
                raise _refused(client, step, completion, record, exc) from exc
            if record is not None:
                record.rejected = calls.Rejection(exc.kind, str(exc))
            kind, reason = exc.kind, str(exc)
            client.meter.reject(step, kind)
            attempt, sent = attempt + 1, None
    client.meter.gave_up(step)
    raise StepFailed(step, kind, reason)


def _limit(params: Mapping[str, int | None]) -> str:
    """"max_tokens=600" as the request said it; the provider's own default when it set none."""
    name, value = next(iter(params.items()))
    return f"{name}={value}" if value else "the provider's default max_tokens (the request set none)"


def _refused(client: LLMClient, step: str, completion: Completion, record: calls.CallRecord | None,
             exc: ParseError | None = None) -> StepFailed:
    """The step's failure for a refused reply: counted as ``content_filter``, never asked again."""
    why = f"finish_reason={completion.finish_reason}" + (f", refusal: {excerpt(completion.refusal)}"
                                                         if completion.refusal else "")
    message = f"the provider refused to answer ({why})" + (f"; the partial reply is unusable: {exc}" if exc else "")
    if record is not None:
        record.rejected = calls.Rejection(REFUSAL_KIND, message)
    client.meter.reject(step, REFUSAL_KIND)
    return StepFailed(step, REFUSAL_KIND, message)


def _record(client: LLMClient, step: str, attempt: int, messages: Messages, started: int,
            completion: Completion | None = None, rejected: calls.Rejection | None = None
            ) -> calls.CallRecord:
    """What the tracing layer needs of one attempt (only built while a call log is open)."""
    record = calls.CallRecord(step=step, attempt=attempt, model=client.model.name,
                              litellm_model=client.model.litellm_model, messages=messages, started_ns=started,
                              ended_ns=time.time_ns(), rejected=rejected)
    if completion is not None:
        record.reply, record.finish_reason = completion.text, completion.finish_reason
        record.prompt_tokens, record.completion_tokens = completion.prompt_tokens, completion.completion_tokens
        record.cost_usd, record.cached, record.retries = completion.cost_usd, completion.cached, completion.retries
    return record
