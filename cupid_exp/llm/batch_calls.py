"""The client's side of the Batch API: a call as a batch row, priced at batch rates and counted like a live call. Upload
and creation go through the retry policy, so a fatal refusal stops the job instead of failing every row."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from cupid_exp.config import ModelConfig
from cupid_exp.llm.batch import Batcher, BatchSettings, Guard, RowBill, RowFailed
from cupid_exp.llm.batch_ledger import BatchLedger
from cupid_exp.llm.batch_providers import batch_provider
from cupid_exp.llm.billing import counted_tokens, lost_after_sending, reply_text
from cupid_exp.llm.budget import in_flight_worst, reserve_call
from cupid_exp.llm.errors import ProviderError, _short, provider_error_kind
from cupid_exp.llm.messages import Message
from cupid_exp.llm.retry import CallFailed, FatalProviderError, RetryLater, is_billing, stop_job, with_retries
from cupid_exp.llm.usage import Completion, WorstCase

if TYPE_CHECKING:
    from cupid_exp.llm.client import LLMClient


def batch_price(model: ModelConfig, prompt_tokens: int, completion_tokens: int) -> float | None:
    """A reply's cost at the provider's batch prices (litellm's map), else the config's prices, else None."""
    import litellm

    info = model.model_info
    if info.input_cost_per_token is not None and info.output_cost_per_token is not None:
        return prompt_tokens * info.input_cost_per_token + completion_tokens * info.output_cost_per_token
    try:
        cost_in, cost_out = litellm.cost_per_token(model=model.litellm_model, prompt_tokens=prompt_tokens,
                                                   completion_tokens=completion_tokens, call_type="aretrieve_batch")
    except (litellm.exceptions.ModelNotMappedError, litellm.exceptions.BadRequestError,
            litellm.exceptions.NotFoundError):
        return None
    return float(cost_in + cost_out)


def new_batcher(client: LLMClient) -> Batcher:
    # no retries of the OpenAI SDK's (it retried a 429 insufficient_quota twice): ours decide (``client_guard``); only
    # a model with a Batch API gets here (``client._wants_batch``)
    model, settings, api_key = client.model, client.settings, client._send_params.get("api_key")
    kwargs: dict[str, Any] = {"custom_llm_provider": batch_provider(model.litellm_model), "max_retries": 0}
    if model.api_base:
        kwargs["api_base"] = model.api_base
    if api_key:
        kwargs["api_key"] = api_key
    endpoint = {"model": model.litellm_model, "api_base": model.api_base}
    ledger = BatchLedger(Path(settings.cache_dir).expanduser() / "batches")
    batches = BatchSettings(size=settings.batch_size, delay_s=settings.batch_delay_s, poll_s=settings.batch_poll_s,
                            max_resubmits=settings.num_retries)
    return Batcher(endpoint, kwargs, ledger, batches, client.meter.batches, client_guard(client))


async def batched_completion(batcher: Batcher, model: ModelConfig, messages: list[Message], kwargs: dict[str, Any],
                             bill: RowBill) -> Completion:
    """One call through the Batch API (``RowFailed`` when it fails); ``bill``: the row's cost beyond its reply."""
    params = {k: v for k, v in kwargs.items() if k not in ("caching", "cache")}
    body = {"model": model.litellm_model.split("/", 1)[1], "messages": messages, **params}
    start = time.perf_counter()
    reply = await batcher.complete(body, bill)
    choice = (reply.get("choices") or [{}])[0]
    prompt_tokens, completion_tokens, estimated = counted_tokens(model.litellm_model, messages, reply.get("usage"),
                                                                 reply_text(choice))  # a row without usage: counted
    return Completion(text=(choice.get("message") or {}).get("content") or "", prompt_tokens=prompt_tokens,
                      completion_tokens=completion_tokens, cached=bill.free, usage_estimated=estimated,
                      cost_usd=batch_price(model, prompt_tokens, completion_tokens),
                      seconds=time.perf_counter() - start, finish_reason=choice.get("finish_reason"))


def unread_usd(client: LLMClient, worst: WorstCase, unread: int) -> float:
    """The cost of ``unread`` billed attempts: the worst case (``worst``) each at batch prices (unpriced: nothing)."""
    if not unread or client.pricing.worst is None:
        return 0.0
    usd = batch_price(client.model, worst.prompt_tokens, worst.completion_tokens)
    return unread * (usd if usd is not None else worst.usd)


def client_guard(client: LLMClient) -> Guard:
    """The batcher's upload and creation under ``client``'s live retry policy, and its stop for later."""
    async def run(send: Callable[[], Awaitable[Any]]) -> object:
        response, _ = await with_retries(send, client, tokens=0)
        return response

    def later(kind: str, message: str) -> FatalProviderError:
        return stop_job(RetryLater(client.model.name, kind, client._scrub(message), client.roles), client.pool,
                        client.stop)

    return Guard(run, later, client.settings.rate_limit_patience_s, client.settings.outage_patience_s)


def row_failure_kind(exc: RowFailed) -> str:
    """The failure kind a live call with the same HTTP status would have been counted as (a 401 or 403 never comes
    here: ``_row_refusal`` stops the job for it first)."""
    text = str(exc).lower()
    if exc.code == "context_length_exceeded" or "context length" in text or "maximum context" in text:
        return "context_length"
    if exc.status == 429:
        return "rate_limit"
    if exc.status == 408:
        return "timeout"
    return "provider"


def _row_refusal(exc: RowFailed) -> str | None:
    """The fatal kind of a row refused as a live call would be for good (a key, a model, a billing state)."""
    if exc.status in (401, 403):
        return "auth"
    if exc.status == 404 or exc.code == "model_not_found":
        return "model_not_found"
    return exc.code if is_billing(exc.code) else None


async def complete_in_batch(client: Any, messages: list[Message], step: str,
                            kwargs: dict[str, Any]) -> Completion:
    """The call through the Batch API: the worst case held at the live price, settled at the row's batch price; failures
    counted and stopping the job as live ones do."""
    if client._batcher is None or client._batcher.loop is not asyncio.get_running_loop():
        client._batcher = new_batcher(client)
    held, bill = await reserve_call(client, messages, kwargs, step), RowBill()
    worst = in_flight_worst(client.pricing.worst, messages, kwargs)
    client.meter.sending(step, worst)  # the row, in flight until its call is counted (a kill: its worst case)
    try:
        completion = await batched_completion(client._batcher, client.model, messages, kwargs, bill)
    except BaseException as exc:
        unread = unread_usd(client, worst, bill.unread)
        if held is not None:
            held.failed(exc, beyond=unread)
        # however the call is counted below; a row the job stopped waiting for stays in flight: its worst case
        client.meter.charge(step, unread, bill.unread, settled={} if lost_after_sending(exc) else worst.in_flight(-1))
        if not isinstance(exc, Exception) or isinstance(exc, FatalProviderError):
            raise  # the job's stop (set by this batch's upload or another call) or an interruption
        if isinstance(exc, CallFailed):  # the upload or the batch's creation failed for good
            if exc.fatal:
                raise (client.stop.fatal or client.pool.fatal) from exc.cause
            client.meter.fail(step, exc.kind)
            raise ProviderError(exc.kind, f"{client.model.name}: batch upload: " + (
                exc.reason or f"{type(exc.cause).__name__}: {client._scrub(_short(exc.cause))}")) from exc.cause
        if isinstance(exc, RowFailed) and (fatal := _row_refusal(exc)) is not None:
            raise stop_job(FatalProviderError(client.model.name, fatal, client._scrub(_short(exc)), client.roles),
                           client.pool, client.stop) from exc
        kind = row_failure_kind(exc) if isinstance(exc, RowFailed) else provider_error_kind(exc)
        if kind is None:
            raise
        client.meter.fail(step, kind)
        raise ProviderError(kind, f"{client.model.name}: {type(exc).__name__}: {_short(exc)}") from exc
    completion.charged_usd = unread_usd(client, worst, bill.unread)
    completion.charged_requests = bill.unread
    if held is not None:
        held.settle(0.0 if completion.cached else completion.cost_usd, beyond=completion.charged_usd)
    client.meter.add(step, completion, settled=worst.in_flight(-1))
    return completion
