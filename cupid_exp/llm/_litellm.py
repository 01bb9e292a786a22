"""Every touch of litellm's private layout, quarantined in one module.

Each function works around a measured cost or defect of litellm through something it does not document. When
the layout changes they do nothing (slower, same results), and ``probe()``, checked by
``tests/llm/test_litellm_layout.py``, says which no longer find their target.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from litellm import CustomLLM

log = logging.getLogger(__name__)


#: litellm's private targets, by name: (module, attribute path)
_TARGETS = {"native_state_flag": ("litellm.rust_bridge._native", "process_state_started"),
            "pending_cache_writes": ("litellm.caching.caching_handler", "_PENDING_CACHE_WRITES"),
            "logging_worker": ("litellm.litellm_core_utils.logging_worker", "GLOBAL_LOGGING_WORKER"),
            "internal_call_flag": ("litellm._internal_context", "is_internal_call"),
            "custom_llm_setup": ("litellm.utils", "custom_llm_setup"),
            "developer_role": ("litellm.llms.openai.chat.gpt_transformation",
                               "OpenAIGPTConfig.translate_developer_role_to_system_role"),
            "cache_args_to_kwargs": ("litellm.caching.caching_handler", "convert_args_to_kwargs"),
            "cache_options_adapter": ("litellm.caching.caching_handler", "TypeAdapter"),
            "cost_breakdown": ("litellm.cost_calculator", "get_token_type_cost_breakdown")}

# What the first request imports (measured: ~0.45 s here, ~580 modules: the OpenAI client's resources and
# types, litellm's OpenTelemetry hooks and proxy types), imported by ``import_first_call_modules``.
FIRST_CALL_MODULES = ("openai.resources", "litellm.integrations.otel.logger", "litellm.proxy._types")


def _target(name: str) -> Any:
    """One private target; ImportError where this litellm lacks it."""
    module, path = _TARGETS[name]
    try:
        return functools.reduce(getattr, path.split("."), importlib.import_module(module))
    except AttributeError as exc:
        raise ImportError(f"{module} has no {path}") from exc


def _first_call_modules() -> list[ModuleType]:
    return [importlib.import_module(name) for name in FIRST_CALL_MODULES]


def probe() -> dict[str, bool]:
    """Which private targets this litellm version still has (all True on the tested version)."""
    found = {}
    for name in (*_TARGETS, "first_call_modules"):
        try:
            found[name] = (_first_call_modules() if name == "first_call_modules" else _target(name)) is not None
        except ImportError:
            found[name] = False
    return found


def drop_legacy_cache_callbacks() -> None:
    """Remove the string "cache" that litellm's ``Cache()`` puts in its global callback lists: litellm no longer reads
    it, but a non-empty ``success_callback`` has every async call build and price a logging payload for no one on a
    thread pool (about a tenth of a call's CPU). Caching is unchanged without it."""
    import litellm

    for callbacks in (litellm.input_callback, litellm.success_callback, litellm._async_success_callback):
        while "cache" in callbacks:
            callbacks.remove("cache")


def _wrap_once(name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """The target ``name`` replaced by ``wrap(it)``, once: a second call (another job in this process) finds the
    wrapper, marked with what it wraps. On another layout nothing: litellm does as it would anyway."""
    try:
        original = _target(name)
    except ImportError:
        return
    if getattr(original, "_litellms_own", None) is None:
        wrapper = wrap(original)
        wrapper._litellms_own = original  # type: ignore[attr-defined]
        module, attribute = _TARGETS[name]
        setattr(importlib.import_module(module), attribute, wrapper)


def skip_signature_without_positional_args() -> None:
    """litellm's cache layer names a call's positional arguments by ``inspect.signature`` of ``acompletion``, on the
    lookup and again on the write, even for a call that has none (ours pass keywords only): ~50 µs of CPU each, a
    few percent of a call's. With no positional arguments its answer is ``{}``, given here without the signature;
    with some, litellm's own function answers."""
    def wrap(convert: Callable[..., dict[str, object]]) -> Callable[..., dict[str, object]]:
        def args_to_kwargs(original_function: Callable[..., object], args: tuple[object, ...] | None = None
                           ) -> dict[str, object]:
            return convert(original_function, args) if args else {}

        return args_to_kwargs

    _wrap_once("cache_args_to_kwargs", wrap)


def reuse_cache_options_adapter() -> None:
    """litellm's cache layer builds a pydantic ``TypeAdapter(Mapping[str, object])`` for every reply it stores, to
    check the call's ``cache`` options (ours carry the namespace): building one compiles a schema, ~0.13 ms of CPU
    (near 2% of a call's), checking with it ~0.3 µs. Here the adapter of a type is built once and reused: the same
    check, the same answer."""
    def wrap(build: Callable[..., object]) -> Callable[..., object]:
        adapters: dict[object, object] = {}

        def type_adapter(type_: object, *args: object, **kwargs: object) -> object:
            if args or kwargs:
                return build(type_, *args, **kwargs)
            try:
                return adapters[type_]
            except KeyError:
                adapters[type_] = adapter = build(type_)
                return adapter
            except TypeError:  # an unhashable type: built each time, as litellm does
                return build(type_)

        return type_adapter

    _wrap_once("cache_options_adapter", wrap)


def skip_cost_breakdown_of_internal_calls() -> None:
    """litellm prices each reply twice: its total (``response_cost``, what we bill by) and again by token type for its
    logging callbacks (``get_token_type_cost_breakdown``: the model's map entry walked a second time, about half of
    the pricing's CPU). Our calls run with its "internal call" flag (``no_logging_flag``), which skips those
    callbacks: there the breakdown is left at zero, as litellm leaves it for an unpriced model. The total is
    computed as before; any other call gets litellm's breakdown."""
    try:
        from litellm.litellm_core_utils.llm_cost_calc.utils import TokenTypeCostBreakdown
    except ImportError:  # another layout: litellm computes the breakdown, as it would anyway
        return
    internal = no_logging_flag()
    if internal is None:
        return

    def wrap(breakdown: Callable[..., TokenTypeCostBreakdown]) -> Callable[..., TokenTypeCostBreakdown]:
        def token_type_cost_breakdown(*args: object, **kwargs: object) -> TokenTypeCostBreakdown:
            return TokenTypeCostBreakdown(0.0, 0.0, 0.0) if internal.get() else breakdown(*args, **kwargs)

        return token_type_cost_breakdown

    _wrap_once("cost_breakdown", wrap)


def native_runtime_started() -> bool:
    """Whether litellm's Rust extension has run in this process (a native route starts its runtime threads: a
    Router call does, ``litellm.acompletion`` to an OpenAI-style API does not). A process forked after that cannot
    call models (``ForkedAfterNativeRuntimeStarted``). True where this litellm cannot say."""
    try:
        return bool(_target("native_state_flag")())
    except (ImportError, AttributeError):
        log.debug("could not read whether litellm's native runtime started", exc_info=True)
        return True


def import_first_call_modules() -> None:
    """Import now what litellm and the OpenAI SDK import on the first request, so that cost is start-up,
    not a stall of the event loop while the first calls wait (it inflated the model phase by ~0.45 s)."""
    try:
        _first_call_modules()
    except ImportError:  # another layout: the first request imports what it needs, as it would anyway
        log.debug("could not import the first call's modules", exc_info=True)


def keep_developer_role() -> None:
    """Send a ``developer`` message as ``developer`` to OpenAI-style chat APIs: litellm rewrites it to ``system`` for
    all but the o-series, while the official tool sends its evaluator's instructions as ``developer`` (drop-in
    prompts must make the official calls). Only messages built with ``system_role: developer`` are affected."""
    try:
        from litellm.llms.openai.chat.gpt_transformation import OpenAIGPTConfig
    except ImportError:  # another layout: the role may be rewritten, which tests/tasks catch on the wire
        log.debug("could not keep the developer role", exc_info=True)
        return
    # litellm types the method with its message TypedDicts; ours takes and returns any messages unchanged
    OpenAIGPTConfig.translate_developer_role_to_system_role = _as_given  # type: ignore[method-assign,assignment]


def _as_given(self: object, messages: list[Any], *args: object, **kwargs: object) -> list[Any]:
    # litellm 1.109 added keyword arguments (model, api_base, ...) that the answer does not depend on
    return messages


@functools.cache
def no_logging_flag() -> Any:
    """litellm's "internal call" context flag: set around our calls, it skips litellm's per-call logging callbacks,
    pure CPU waste without callbacks configured (cost, usage, caching and retries are computed outside it). None on
    another layout. Looked up once."""
    try:
        return _target("internal_call_flag")
    except ImportError:
        return None


async def flush_cache_writes() -> None:
    """Await litellm's background cache-write tasks (it schedules them fire-and-forget), so a paid call
    is on disk before anyone relies on it: a kill must not lose it."""
    try:
        pending = [t for t in list(_target("pending_cache_writes")) if not t.done()]
    except ImportError:  # another litellm layout: fall back to its own scheduling
        return
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


async def stop_logging_worker(timeout: float = 10.0) -> None:
    """Flush and stop litellm's logging worker before the event loop closes. It loops forever, so waiting
    on every pending task would always run into the timeout (10 s added to every job)."""
    try:
        worker = _target("logging_worker")
    except ImportError:
        return
    try:
        await asyncio.wait_for(worker.flush(), timeout)
    except Exception:  # noqa: BLE001  # litellm's own worker: a slow or failing logging callback must not fail the job
        log.debug("litellm logging worker did not flush", exc_info=True)
    await worker.stop()  # it restarts on its own in the next event loop


def register_custom_provider(name: str, handler: CustomLLM) -> None:
    """Make ``<name>/<model>`` routable to an in-process ``litellm.CustomLLM`` handler."""
    import litellm

    litellm.custom_provider_map = [*[p for p in litellm.custom_provider_map if p.get("provider") != name],
                                   {"provider": name, "custom_handler": handler}]
    _target("custom_llm_setup")()
