"""One client layer over litellm for every provider.

litellm's Router gives retries with backoff (honouring retry-after) and timeouts,
litellm's disk cache gives the persistent response cache, and litellm's price map
gives cost. This module adds only what litellm lacks: bounded concurrency per model,
a cache namespace that covers api_base and every decoding parameter, and per-step
usage accounting.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cupid_exp.config import ModelConfig, RuntimeConfig

log = logging.getLogger(__name__)


class ProviderError(RuntimeError):
    """A model call that failed after retries; ``kind`` classifies it for the failure counts."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(message)


@dataclass
class Completion:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0
    cached: bool = False
    seconds: float = 0.0
    retries: int = 0


@dataclass
class UsageMeter:
    """Per-step counters: calls, cache hits, tokens, cost, failures."""

    counts: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))

    def add(self, step: str, completion: Completion) -> None:
        c = self.counts[step]
        c["calls"] += 1
        c["cache_hits"] += int(completion.cached)
        c["retries"] += completion.retries
        c["prompt_tokens"] += completion.prompt_tokens
        c["completion_tokens"] += completion.completion_tokens
        if completion.cost_usd is None:
            c["unpriced_calls"] += 1
        elif not completion.cached:
            c["cost_usd"] += completion.cost_usd

    def fail(self, step: str, kind: str, retries: int = 0) -> None:
        self.counts[step][f"failed_{kind}"] += 1
        self.counts[step]["retries"] += retries  # a call that gave up after N retries sent N+1 requests

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for c in self.counts.values():
            for k, v in c.items():
                out[k] += v
        return dict(out)

    def as_dict(self) -> dict[str, dict[str, float]]:
        return {step: dict(c) for step, c in self.counts.items()}


_CACHE_DIR: str | None = None


def configure_litellm(runtime: RuntimeConfig) -> None:
    """Process-wide litellm settings: quiet, offline price map, disk cache."""
    global _CACHE_DIR
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.drop_params = True  # a provider that rejects a param (e.g. seed) gets it dropped, not an error
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if runtime.cache:
        cache_dir = str(Path(runtime.cache_dir).expanduser().resolve())
        if cache_dir != _CACHE_DIR:
            from litellm.caching.caching import Cache

            litellm.cache = Cache(type="disk", disk_cache_dir=cache_dir)
            _CACHE_DIR = cache_dir
    else:
        litellm.cache = None
        _CACHE_DIR = None
    _drop_legacy_cache_callbacks()


def _drop_legacy_cache_callbacks() -> None:
    """Remove the string "cache" that litellm's ``Cache()`` puts in its global callback lists.

    litellm no longer reads it (its caching handler reads and writes the cache itself), but a non-empty
    ``success_callback`` makes every async call hand litellm's sync success handler to a thread pool,
    which builds the full logging payload and prices the response a second time for no one: measured
    ~0.7 ms of CPU per call (~10%). Cache hits, keys and writes are unchanged without it.
    """
    import litellm

    for callbacks in (litellm.input_callback, litellm.success_callback, litellm._async_success_callback):
        while "cache" in callbacks:
            callbacks.remove("cache")


def _error_kind(exc: BaseException) -> str:
    import litellm

    if isinstance(exc, litellm.ContextWindowExceededError):
        return "context_length"
    text = str(exc).lower()
    if any(s in text for s in ("context_length_exceeded", "context length", "maximum context", "too many tokens",
                               "prompt is too long", "input is too long", "exceeds n_ctx")):
        return "context_length"
    if isinstance(exc, (litellm.Timeout, asyncio.TimeoutError)):
        return "timeout"
    if isinstance(exc, litellm.RateLimitError):
        return "rate_limit"
    if isinstance(exc, (litellm.AuthenticationError, litellm.PermissionDeniedError)):
        return "auth"
    return "provider"


_ROUTERS: dict[str, Any] = {}


def _router(model: ModelConfig, params: dict[str, Any], runtime: RuntimeConfig,
            model_info: dict[str, Any] | None = None) -> Any:
    """The litellm Router for one deployment, made once per process.

    Every Router adds itself to litellm's global callback lists and price registrations, and every
    call of every Router then pays for all of them: measured here, each extra Router added ~0.7 ms of
    CPU to every call, so a sweep of jobs in one process got slower job after job. Jobs with the same
    model config share one Router, and its usage-tracking and cooldown callbacks (we use neither:
    cooldowns are disabled, there is one deployment) are unhooked.
    """
    import litellm

    key = hashlib.sha256(json.dumps([model.name, params, model_info, runtime.num_retries, runtime.timeout],
                                    sort_keys=True, default=str).encode()).hexdigest()
    if key in _ROUTERS:
        return _ROUTERS[key]
    known = set(litellm.model_cost)
    router = litellm.Router(
        model_list=[{"model_name": model.name, "litellm_params": params,
                     **({"model_info": dict(model_info)} if model_info else {})}],
        num_retries=runtime.num_retries,
        timeout=runtime.timeout,
        disable_cooldowns=True,
    )
    # litellm's Router registers an empty price entry under "<provider>/<model>", which then
    # shadows the real price and makes every call cost $0; drop such empty entries.
    bare = model.litellm_model.split("/", 1)[-1]
    for name in set(litellm.model_cost) - known:
        if name in (model.litellm_model, bare) and "input_cost_per_token" not in (litellm.model_cost[name] or {}):
            del litellm.model_cost[name]
    _unhook_callbacks(router)
    _ROUTERS[key] = router
    return router


def _unhook_callbacks(router: Any) -> None:
    """Remove a Router's own entries from litellm's global callback lists (what ``Router.discard`` does,
    without also dropping the Router from litellm's price-map bookkeeping)."""
    import litellm

    try:
        manager = litellm.logging_callback_manager
        for callbacks in (litellm._async_success_callback, litellm.success_callback, litellm._async_failure_callback,
                          litellm.failure_callback, litellm.input_callback, litellm.service_callback,
                          litellm.callbacks):
            manager.remove_callback_from_list_by_object(callbacks, router)
    except Exception:  # noqa: BLE001  # another litellm layout: slower calls, same results
        log.debug("could not unhook the Router's callbacks", exc_info=True)


def _no_logging_context() -> Any:
    """litellm's "internal call" flag, set around our calls: it skips litellm's per-call logging callbacks.

    Without callbacks configured (cupid-exp configures none) that logging is pure waste: every call
    queues a task that rebuilds litellm's standard logging payload (~0.5 ms of CPU per call, measured).
    Response cost, usage, cache hits/writes and the Router's retries are computed outside it and stay.
    The flag lives in a private module: on another litellm layout this returns None and calls log as before.
    """
    try:
        from litellm._internal_context import is_internal_call
    except ImportError:
        return None
    return is_internal_call


class LLMClient:
    """Completions for one configured model, shared by every step that uses it."""

    def __init__(self, model: ModelConfig, runtime: RuntimeConfig, meter: UsageMeter):
        self.model, self.runtime, self.meter = model, runtime, meter
        if model.local is not None:
            from cupid_exp.llm.local import register_local_model

            register_local_model(model.litellm_model, model.local)
        params: dict[str, Any] = {"model": model.litellm_model}
        if model.api_base:
            params["api_base"] = model.api_base
        key = os.environ.get(model.api_key_env) if model.api_key_env else None
        if key:
            params["api_key"] = key
        elif model.api_base:
            params["api_key"] = "EMPTY"  # OpenAI-compatible servers without auth still need a value
        # Configured prices go in the deployment's model_info, where the Router registers them once under
        # the deployment's id and litellm prices every response from there. In litellm_params (the obvious
        # place) litellm re-registers them on every call, which invalidates its price-map index and
        # model-info caches: ~2.5 ms of CPU per call (measured), for the same response_cost.
        prices = {k: v for k, v in (("input_cost_per_token", model.input_cost_per_token),
                                    ("output_cost_per_token", model.output_cost_per_token)) if v is not None}
        self._router = _router(model, params, runtime, prices)
        self._semaphore = asyncio.Semaphore(max(1, model.max_concurrency))
        self._unpriced = False
        self._internal = _no_logging_context()

    def _price(self, response: Any) -> float | None:
        """Cost from litellm's price map; None for an unpriced model (tried once per client, not per call)."""
        import litellm

        if self._unpriced:
            return None
        try:
            return float(litellm.completion_cost(completion_response=response))
        except Exception:  # unpriced model: counted, never guessed
            self._unpriced = True
            return None

    def cache_namespace(self, json_schema: dict | None, params: dict | None = None) -> str:
        """Everything besides messages that changes an answer; litellm's own key misses api_base."""
        identity = {
            "model": self.model.litellm_model,
            "api_base": self.model.api_base,
            "params": {**self.model.params, **(params or {})},
            "schema": json_schema if self.model.structured_output else None,
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:24]

    def _dry_run(self, messages: list[dict], step: str, kwargs: dict[str, Any]) -> Completion:
        from cupid_exp.llm.dry_run import estimate, placeholder_reply

        max_tokens = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens")
        prompt_tokens, completion_tokens, cost = estimate(
            self.model.litellm_model, messages, max_tokens, self.runtime.dry_run_completion_tokens,
            self.model.input_cost_per_token, self.model.output_cost_per_token)
        completion = Completion(text=placeholder_reply(step, messages), prompt_tokens=prompt_tokens,
                                completion_tokens=completion_tokens, cost_usd=cost)
        self.meter.add(step, completion)
        return completion

    async def complete(self, messages: list[dict], *, step: str, json_schema: dict | None = None,
                       params: dict[str, Any] | None = None) -> Completion:
        """One chat completion; ``params`` overrides the model's decoding parameters for this step."""
        kwargs: dict[str, Any] = {**self.model.params, **(params or {})}
        if json_schema is not None and self.model.structured_output:
            kwargs["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "reply", "schema": json_schema, "strict": True}}
        if self.runtime.cache:
            kwargs["caching"] = True
            kwargs["cache"] = {"namespace": self.cache_namespace(json_schema, params)}
        start = time.perf_counter()
        if self.runtime.dry_run:
            return self._dry_run(messages, step, kwargs)
        token = self._internal.set(True) if self._internal is not None else None
        try:
            async with self._semaphore:
                response = await self._router.acompletion(model=self.model.name, messages=messages, **kwargs)
        except Exception as exc:  # litellm maps every provider's errors to its own exception types
            kind = _error_kind(exc)
            self.meter.fail(step, kind, retries=_retries_of(exc))
            raise ProviderError(kind, f"{self.model.name}: {type(exc).__name__}: {_short(exc)}") from exc
        finally:
            if token is not None:
                self._internal.reset(token)
        if not getattr(response, "choices", None):
            # litellm returns None instead of raising when a server rejects a request with HTTP 422 twice
            # (its drop_params retry); without this check the job died on an AttributeError.
            self.meter.fail(step, "provider")
            raise ProviderError("provider", f"{self.model.name}: the provider returned no completion "
                                            f"(got {type(response).__name__}; e.g. an HTTP 422 rejection)")
        await _flush_cache_writes()  # durable before anyone relies on it (a kill must not lose a paid call)
        text = response.choices[0].message.content or ""
        usage = getattr(response, "usage", None)
        hidden = getattr(response, "_hidden_params", None) or {}
        cached = bool(hidden.get("cache_hit"))
        retries = int((hidden.get("additional_headers") or {}).get("x-litellm-attempted-retries") or 0)
        cost = hidden.get("response_cost")  # litellm prices every response (with the config's own prices)
        if not isinstance(cost, (int, float)):
            cost = self._price(response)
        completion = Completion(
            text=text,
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            cost_usd=cost,
            cached=cached,
            seconds=time.perf_counter() - start,
            retries=retries,
        )
        self.meter.add(step, completion)
        return completion


async def _flush_cache_writes() -> None:
    """Await litellm's background cache-write tasks (it schedules them fire-and-forget)."""
    try:
        from litellm.caching.caching_handler import _PENDING_CACHE_WRITES
    except ImportError:  # another litellm layout: fall back to its own scheduling
        return
    pending = [t for t in list(_PENDING_CACHE_WRITES) if not t.done()]
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


def _retries_of(exc: BaseException) -> int:
    """Retries the Router made before giving up (litellm sets ``num_retries`` on the final exception)."""
    try:
        return max(0, int(getattr(exc, "num_retries", 0) or 0))
    except (TypeError, ValueError):
        return 0


def _short(exc: BaseException, n: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= n else text[: n - 1] + "…"


async def drain_background_tasks(timeout: float = 10.0) -> None:
    """Let litellm finish its async cache writes and logging callbacks before the event loop closes.

    litellm's logging worker loops forever, so waiting on every pending task would always run into
    the timeout (10 s added to every job); it is flushed and stopped instead.
    """
    await _flush_cache_writes()
    try:
        from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER as worker
    except ImportError:  # another litellm layout
        worker = None
    if worker is not None:
        try:
            await asyncio.wait_for(worker.flush(), timeout)
        except Exception:  # noqa: BLE001  # a slow or failing logging callback must not fail the job
            log.debug("litellm logging worker did not flush", exc_info=True)
        await worker.stop()  # it restarts on its own in the next event loop
    current = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    if pending:
        await asyncio.wait(pending, timeout=timeout)
