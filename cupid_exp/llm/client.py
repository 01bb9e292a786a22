"""One client layer over litellm for every provider, the embedded model included.

Each request is one ``litellm.acompletion`` with the call's timeout and none of litellm's or the SDK's retries;
litellm gives the response cache (on disk: ``response_cache``), the price map and the cost. This module adds what
litellm lacks: a cache namespace covering api_base and every decoding parameter, per-step usage, and the line
between a provider's failure (counted, the run goes on) and a bug (the job stops). Retries are ours (``retry``),
as are the pools' limits (``pools``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from cupid_exp.config import CallsConfig, ModelConfig
from cupid_exp.llm import _litellm
from cupid_exp.llm.batch_calls import batch_price, complete_in_batch
from cupid_exp.llm.batch_providers import batch_provider
from cupid_exp.llm.billing import (
    CallBill,
    Reply,
    counted_tokens,
    empty_reason,
    lost_after_sending,
    reply_text,
    token_cost,
)
from cupid_exp.llm.budget import Budget, in_flight_worst, model_prices, priced, reserve_call
from cupid_exp.llm.dry_run import PLACEHOLDER, estimate
from cupid_exp.llm.endpoints import canonical_api_base
from cupid_exp.llm.epochs import EPOCH
from cupid_exp.llm.errors import EmptyReply, ProviderError, _short, provider_error_kind  # noqa: F401  (re-exported)
from cupid_exp.llm.limits import estimated_tokens
from cupid_exp.llm.local import register_local_model
from cupid_exp.llm.messages import Message
from cupid_exp.llm.pools import Pool, flush_pools, pool_for
from cupid_exp.llm.retry import CallFailed, JobStop, with_retries
from cupid_exp.llm.usage import Completion, UsageMeter
from cupid_exp.secrets import redact, scrub

if TYPE_CHECKING:
    from cupid_exp.llm.batch import Batcher

log = logging.getLogger(__name__)

DryReply = Callable[[list[Message]], str]


_CACHE_DIR: str | None = None


def configure_litellm(settings: CallsConfig) -> None:
    """Process-wide litellm settings: quiet, offline price map, the response cache on disk."""
    global _CACHE_DIR
    import litellm

    litellm.suppress_debug_info = True
    litellm.drop_params = True  # a provider that rejects a param (e.g. seed) gets it dropped, not an error
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if settings.cache:
        cache_dir = str(Path(settings.cache_dir).expanduser().resolve())
        if cache_dir != _CACHE_DIR:
            from cupid_exp.llm.response_cache import response_cache

            litellm.cache = response_cache(cache_dir)
            _CACHE_DIR = cache_dir
    else:
        litellm.cache = None
        _CACHE_DIR = None
    _litellm.drop_legacy_cache_callbacks()
    _litellm.keep_developer_role()
    _litellm.skip_signature_without_positional_args()
    _litellm.reuse_cache_options_adapter()
    _litellm.skip_cost_breakdown_of_internal_calls()


# A prompt this many characters per token of the model's window cannot fit (real text runs 3-5
# characters per token): refused before it is sent, as a context_length failure that costs nothing.
_CHARS_PER_TOKEN_CEILING = 6


def _mapped(model: ModelConfig, key: str) -> int | None:
    """``key`` of the model's entry in litellm's map (``max_input_tokens``, ``max_output_tokens``); None when the
    map lacks the model or the figure."""
    import litellm

    provider, _, name = model.litellm_model.partition("/")
    try:
        info = litellm.get_model_info(model=name, custom_llm_provider=provider)
    except (litellm.exceptions.ModelNotMappedError, litellm.exceptions.BadRequestError,
            litellm.exceptions.NotFoundError):
        return None
    value = info.get(key)
    return int(value) if isinstance(value, (int, float)) and value else None


class Pricing:
    """What one model's replies cost. litellm prices each reply by its map as it returns it; a config's own prices
    override the map, applied to a reply's tokens by litellm's calculator, never registered in litellm's global map
    (two configs may price one id). ``worst``: the prices a lost request is charged its worst case at (budget or
    not; a budget needs them, ``priced``); None: unpriced."""

    def __init__(self, model: ModelConfig, settings: CallsConfig, budgeted: bool):
        self.litellm_model = model.litellm_model
        self.worst = priced(model, settings) if budgeted else model_prices(model)  # ``model_prices`` either way
        # the prices per token a config gives (the map's for the one it leaves out), for litellm's cost calculator;
        # None when the config gives none (litellm's map prices the call) or the model has no price at all
        self.own: dict[str, float] | None = None
        given, prices = model.model_info, self.worst
        if prices is not None and not model.is_embedded and (given.input_cost_per_token is not None
                                                              or given.output_cost_per_token is not None):
            self.own = {"input_cost_per_token": prices.input, "output_cost_per_token": prices.output}
        self.unpriced = False  # learnt on the first reply litellm cannot price: counted, never guessed

    def of(self, response: Any) -> float | None:
        """A reply's cost; None for an unpriced model (tried once, not per call)."""
        import litellm

        cost = None if self.own else (getattr(response, "_hidden_params", None) or {}).get("response_cost")
        if isinstance(cost, (int, float)):
            return float(cost)
        if self.unpriced:
            return None
        try:
            return float(litellm.completion_cost(completion_response=response, custom_cost_per_token=self.own))
        except (litellm.exceptions.ModelNotMappedError, litellm.exceptions.BadRequestError,
                litellm.exceptions.NotFoundError):
            self.unpriced = True
            return None

    def of_tokens(self, prompt: int, completion: int) -> float | None:
        """The cost of tokens counted here (a reply without usage)."""
        if self.unpriced:
            return None
        cost = token_cost(self.litellm_model, prompt, completion, self.own)
        self.unpriced = cost is None
        return cost


class LLMClient:
    """Completions for one configured model, shared by every step and role that uses it."""

    def __init__(self, model: ModelConfig, settings: CallsConfig, meter: UsageMeter, budget: Budget | None = None):
        self.model, self.settings, self.meter = model, settings, meter
        self.budget = budget  # every call reserves its worst case first (cupid_exp.llm.budget)
        self.pricing = Pricing(model, settings, budgeted=budget is not None)
        if model.local is not None:
            register_local_model(model.litellm_model, model.local)
        params: dict[str, Any] = {"model": model.litellm_model}
        if model.api_base:
            params["api_base"] = model.api_base
        key = os.environ.get(model.api_key_env) if model.api_key_env else None
        if key:
            params["api_key"] = key
        elif model.api_base:
            params["api_key"] = "EMPTY"  # OpenAI-compatible servers without auth still need a value
        provider = _provider(model)
        if provider is not None:  # litellm's own option: given, ``acompletion`` no longer resolves it on the loop
            params["custom_llm_provider"] = provider
        # No litellm Router: it cost ~1.4 ms of CPU per call on top of this (30% of the client's, measured) for
        # nothing the runner uses: no retries (ours: cupid_exp.llm.retry), one deployment, no fallbacks.
        self._send_params = {**params, "timeout": settings.timeout, "num_retries": 0, "max_retries": 0}
        self._batcher: Batcher | None = None
        self._batch = _wants_batch(model, settings)
        self.roles: tuple[str, ...] = (model.name,)  # the roles it serves (``clients_for``), for a fatal refusal
        self.stop = JobStop()  # shared with the job's other clients (``clients_for``)
        self.pool: Pool = pool_for(
            model.litellm_model, model.api_base, key, named=model.pool.name, config_id=_identity(model),
            max_concurrency=model.max_concurrency, rpm=model.pool.rpm, tpm=model.pool.tpm, pools=settings.pools,
            ledger_dir=Path(settings.cache_dir).expanduser() / "rate_limits" if settings.cache_dir else None,
            meter=meter)
        # a bound given once for the pool replaces the role's own (the pool holds every role to it together)
        self._bound = max(1, int(self.pool.members.given.max_concurrency or model.max_concurrency))
        self._semaphore = asyncio.Semaphore(self._bound)
        # input tokens the model takes: the config's, the local model's n_ctx, or litellm's price map
        self.window = model.context_window or (model.local.n_ctx if model.local is not None else
                                               _mapped(model, "max_input_tokens"))
        self._max_output: int | None | bool = False  # looked up on the first cut reply (``longer_reply``)

    @property
    def slots(self) -> int:
        """Calls this client takes at once: ``max_concurrency``, or a whole batch with the Batch API."""
        return self.settings.batch_size if self._batch else self._bound

    def _refuse_oversized(self, messages: list[Message], step: str) -> None:
        """Never pay for a prompt that cannot fit: raise context_length before sending it."""
        if not self.window:
            return
        chars = sum(len(str(m.get("content") or "")) for m in messages)
        if chars > _CHARS_PER_TOKEN_CEILING * self.window:
            self.meter.refuse(step)
            raise ProviderError("context_length", f"{self.model.name}: not sent: a prompt of {chars:,} characters "
                                                  f"cannot fit the model's {self.window:,}-token context window")

    def cache_namespace(self, json_schema: dict[str, Any] | None, params: dict[str, Any] | None = None) -> str:
        """Everything besides messages that changes an answer; litellm's own key misses api_base. An endpoint
        enters in one spelling (``llm.endpoints``) and secrets by name only (a header's or key's value masked):
        another endpoint or model is another namespace, a rotated key is not."""
        identity = {"model": self.model.litellm_model, "api_base": canonical_api_base(self.model.api_base),
                    "params": redact({**self.model.params, **(params or {})}),
                    "schema": json_schema if self.model.structured_output else None}
        return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:24]

    def step_params(self, step: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
        """The caller's parameters over the model's own overrides for this step (``step_params``)."""
        return {**self.model.step_params.get(step, {}), **(params or {})}

    def reply_limit(self, step: str, params: Mapping[str, Any] | None) -> dict[str, int | None]:
        """``{"max_tokens": n}`` (or ``max_completion_tokens``, as the config spells it) a request of ``step`` with
        ``params`` is sent with; None for a request that sets none."""
        sent = {**self.model.params, **self.step_params(step, params)}
        name = "max_completion_tokens" if sent.get("max_completion_tokens") and not sent.get("max_tokens") else \
            "max_tokens"
        return {name: sent.get(name)}

    def longer_reply(self, step: str, params: Mapping[str, Any] | None) -> dict[str, int] | None:
        """The max_tokens to ask again with after a reply cut at it: doubled, at most the longest reply litellm's map
        gives the model; None when the request set none (the provider's default cut it) or it is that longest."""
        ((name, limit),) = self.reply_limit(step, params).items()
        if not limit:
            return None
        if self._max_output is False:  # None where the map does not know (an embedded model's is its n_ctx,
            # which ``llm.local`` enforces)
            self._max_output = None if self.model.local is not None else _mapped(self.model, "max_output_tokens")
        more = 2 * int(limit) if self._max_output is None else min(2 * int(limit), self._max_output)
        return {name: more} if more > int(limit) else None

    def request_params(self, json_schema: dict[str, Any] | None, params: Mapping[str, Any] | None) -> dict[str, Any]:
        own, epoch = dict(params or {}), EPOCH.get()
        if epoch is not None:  # runtime.epochs > 1: the seed (``seed`` or 0) plus the epoch, each epoch its own request
            own["seed"] = int({**self.model.params, **own}.get("seed") or 0) + epoch
        kwargs: dict[str, Any] = {**self.model.params, **own}
        if json_schema is not None and self.model.structured_output:
            kwargs["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "reply", "schema": json_schema, "strict": True}}
        if self.settings.cache:
            kwargs["caching"] = True
            kwargs["cache"] = {"namespace": self.cache_namespace(json_schema, own)}
            if self.model.keep_cut_replies:  # its cut replies are answers: kept in the cache like any other
                from cupid_exp.llm.response_cache import KEEP_CUT

                kwargs["cache"][KEEP_CUT] = True
        return kwargs

    def _dry_run(self, messages: list[Message], step: str, kwargs: dict[str, Any], dry_reply: DryReply | None
                 ) -> Completion:
        max_tokens = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens")
        prompt_tokens, completion_tokens, cost = estimate(self.model, messages, max_tokens,
                                                          self.settings.dry_run_completion_tokens)
        text = dry_reply(messages) if dry_reply is not None else PLACEHOLDER
        at_batch = batch_price(self.model, prompt_tokens, completion_tokens) if batch_provider(
            self.model.litellm_model) else None  # what calls.batch=true would cost: live price without a batch API
        completion = Completion(text=text, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                cost_usd=cost, batch_cost_usd=at_batch if at_batch is not None else cost)
        self.meter.add(step, completion)
        return completion

    async def complete(self, messages: list[Message], *, step: str, json_schema: dict[str, Any] | None = None,
                       params: dict[str, Any] | None = None, dry_reply: DryReply | None = None) -> Completion:
        """One chat completion; ``params`` overrides the model's decoding parameters for this step.

        Raises ProviderError for a provider's failure; anything else (a bug) propagates unchanged.
        """
        params = self.step_params(step, params)
        kwargs = self.request_params(json_schema, params)
        if self.settings.dry_run:
            return self._dry_run(messages, step, kwargs, dry_reply)
        self._refuse_oversized(messages, step)
        if self._batch:  # through the provider's Batch API, counted like a live call
            return await complete_in_batch(self, messages, step, kwargs)
        start = time.perf_counter()
        tokens = estimated_tokens(messages, kwargs.get("max_tokens") or kwargs.get("max_completion_tokens"))
        bill = CallBill(step=step, worst=in_flight_worst(self.pricing.worst, messages, kwargs))
        internal = _litellm.no_logging_flag()
        token = internal.set(True) if internal is not None else None
        try:
            async def reserve() -> None:  # each attempt's worst case, before it waits for the pool's slot
                bill.held = await reserve_call(self, messages, kwargs, step)  # None without a budget

            try:  # the role's bound is held per attempt, not while a refused call waits (``with_retries``)
                reply, attempts = await with_retries(lambda: self._attempt(messages, kwargs, bill), self,
                                                     tokens=tokens, before=reserve, gate=self._semaphore)
            finally:
                bill.release_unused()
        except CallFailed as failed:
            a = failed.attempts
            self.meter.fail(step, failed.kind, retries=a.retries, rate_limited=a.rate_limited, wait_s=a.wait_s,
                            charged_usd=bill.charged_usd, charged=bill.charged, settled=bill.settled())
            if failed.fatal:
                fatal = self.stop.fatal or self.pool.fatal
                assert fatal is not None  # a fatal failure is recorded on the stop before it is raised
                raise fatal from failed.cause
            exc = failed.cause
            raise ProviderError(failed.kind, f"{self.model.name}: " + (
                failed.reason or f"{type(exc).__name__}: {self._scrub(_short(exc))}")) from exc
        except BaseException:
            if bill.sent:  # a budget that refused a retry, a job stopped by another call: what was sent is counted
                self.meter.abandon(step, bill.sent, charged_usd=bill.charged_usd, charged=bill.charged,
                                   settled=bill.settled())
            raise
        finally:
            if token is not None:
                internal.reset(token)
        response = reply.response
        choice = response.choices[0]
        completion = Completion(
            text=choice.message.content or "",
            prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens,
            cost_usd=reply.cost_usd, usage_estimated=reply.estimated,
            charged_usd=bill.charged_usd, charged_requests=bill.charged,
            cached=reply.cached,
            seconds=time.perf_counter() - start,
            retries=attempts.retries, rate_limited=attempts.rate_limited, limit_wait_s=attempts.wait_s,
            finish_reason=getattr(choice, "finish_reason", None),
            refusal=getattr(choice.message, "refusal", None) or None,  # OpenAI structured outputs' refusal
        )
        # counted (its requests in flight settled) before anything is awaited: a job stopped now has paid for it
        self.meter.add(step, completion, settled=bill.settled())
        await _litellm.flush_cache_writes()
        from cupid_exp.llm.response_cache import raise_failed_write

        raise_failed_write()  # a cache that could not keep the reply stops the job (a full disk)
        return completion

    async def _attempt(self, messages: list[Message], kwargs: dict[str, Any], bill: CallBill) -> Reply:
        """One request of a call, inside the pool's slot: its reservation (``bill.held``: a retry that did not
        fit the budget was not sent) settled at what the provider bills for it (``cupid_exp.llm.billing``); a reply
        without a completion raises ``EmptyReply`` (retried like a 5xx) once its cost is counted."""
        # the replies just received are written to the response cache on a thread: a twin of one of them, queued on
        # the role's bound until that call let it go, reads the entry instead of asking again (nothing sent yet).
        # Not awaited after this attempt's reply instead: a job stopped during that wait lost the reply's tokens from
        # its spend (the reply is counted by ``complete``, before anything is awaited)
        await _litellm.flush_cache_writes()
        held, bill.held = bill.held, None
        bill.sent += 1
        self.meter.sending(bill.step, bill.worst)  # before it goes out: a kill from now on charges its worst case
        try:
            response = await self._send(messages, kwargs)
        except BaseException as exc:
            lost = lost_after_sending(exc)
            # a lost request's charge: its worst case at the model's prices (0 for an unpriced model: not guessed)
            usd = bill.worst.usd if lost else 0.0
            if held is not None:
                held.settle(usd)
            bill.charge(usd, *((bill.worst.prompt_tokens, bill.worst.completion_tokens) if lost else (0, 0)))
            raise
        reply = self._billed(messages, response)
        if held is not None:
            held.settle(0.0 if reply.cached else reply.cost_usd)  # None (unpriced): its worst case
        empty = empty_reason(response)
        if empty is not None:
            if not reply.cached:
                bill.charge(reply.cost_usd, reply.prompt_tokens, reply.completion_tokens)
            raise EmptyReply(f"{self.model.name}: the provider returned no completion ({empty})",
                             status_code=422 if response is None else None)
        return reply

    def _billed(self, messages: list[Message], response: object) -> Reply:
        """The tokens and cost of a reply as billed: its usage, or a local count where it carries none."""
        if response is None:  # litellm's None for a request rejected twice (HTTP 422): nothing billed
            return Reply(None, 0, 0, 0.0, False)
        choices = getattr(response, "choices", None)
        hidden = getattr(response, "_hidden_params", None) or {}
        prompt, completion, estimated = counted_tokens(self.model.litellm_model, messages,
                                                       getattr(response, "usage", None),
                                                       reply_text(choices[0]) if choices else "")
        if not estimated:
            cost = self.pricing.of(response)
        elif self.model.is_embedded:
            cost = 0.0
        else:
            cost = self.pricing.of_tokens(prompt, completion)
        return Reply(response, prompt, completion, cost, estimated, cached=bool(hidden.get("cache_hit")))

    async def _send(self, messages: list[Message], kwargs: dict[str, Any]) -> Any:
        """The one place a request goes out (``messages`` with ``kwargs``' max_tokens): once per attempt,
        inside the pool's slot (``cupid_exp.llm.retry.with_retries``)."""
        import litellm

        sent = {**kwargs, **self._send_params}  # ours win: no retries
        if kwargs.get("caching") and litellm.cache is not None:
            # litellm computes the response cache's key for the lookup and again for the write; given the key, it
            # uses it for both (``cache_key``, one of its call options, never sent to the provider)
            sent["cache_key"] = litellm.cache.get_cache_key(messages=messages, **sent)
        return await litellm.acompletion(messages=messages, **sent)

    def _scrub(self, text: str) -> str:
        """A provider's message without the key (some quote the key they refused)."""
        key = self._send_params.get("api_key")
        return scrub(text, [key]) if key and key != "EMPTY" else text


def _provider(model: ModelConfig) -> str | None:
    """The provider litellm routes ``model`` to, resolved once: without it ``acompletion`` resolves it again for
    every call, on the event loop (a pydantic check of every option, then the lookup: ~25 µs of CPU). None where
    litellm cannot tell yet (a custom provider registered later): then it resolves it per call, as before."""
    import litellm

    try:
        return litellm.get_llm_provider(model=model.litellm_model, api_base=model.api_base)[1]
    except litellm.exceptions.BadRequestError:
        return None


def _identity(model: ModelConfig) -> str:
    return json.dumps(asdict(model), sort_keys=True, default=str)


def _wants_batch(model: ModelConfig, settings: CallsConfig) -> bool:
    """Whether this model's calls go through a Batch API (``model.batch``, else ``calls.batch``)."""
    wanted = model.batch if model.batch is not None else settings.batch
    if not wanted or settings.dry_run:
        return False
    if batch_provider(model.litellm_model) is None:
        log.warning("%s: %s has no Batch API litellm can drive here; its calls are sent one by one", model.name,
                    model.litellm_model.split("/", 1)[0])
        return False
    return True


def clients_for(roles: Mapping[str, ModelConfig], settings: CallsConfig, meter: UsageMeter,
                budget: Budget | None = None, share: tuple[int, int] = (0, 1)) -> dict[str, LLMClient]:
    """One client per distinct model config, so roles on the same model share its concurrency bound. ``share``:
    this process's index among the ``n`` that split each model's ``max_concurrency`` (together: the configured)."""
    by_identity: dict[str, LLMClient] = {}
    out = {}
    stop = JobStop()  # one fatal refusal stops every role's new calls
    index, n = share
    for role, model in roles.items():
        identity = _identity(model)
        if identity not in by_identity:
            whole = model.max_concurrency
            own = model if n == 1 else replace(model, max_concurrency=whole // n + (index < whole % n))
            by_identity[identity] = LLMClient(own, settings, meter, budget)
            by_identity[identity].roles, by_identity[identity].stop = (), stop
        out[role] = by_identity[identity]
        out[role].roles += (role,)
    return out


async def drain_background_tasks(timeout: float = 10.0) -> None:
    """Let litellm finish its cache writes and logging before the event loop closes; the pools' last counts go
    into the job's meter."""
    flush_pools()
    await _litellm.flush_cache_writes()
    await _litellm.stop_logging_worker(timeout)
    current = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    if pending:
        await asyncio.wait(pending, timeout=timeout)
