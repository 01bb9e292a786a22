"""The stub model in this process, as the litellm provider ``inproc/<name>``: the real call path minus the HTTP hop,
with the stub's replies and hashed faults. Wire-only knobs are refused; ``stats()`` proves a fault happened.

    with InProcessModel(fail_first=1) as model:
        run_job([*model.overrides(), ...])
        assert model.stats()["faults"]
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import litellm

from cupid_exp.testing.cupid_data import stub_overrides
from cupid_exp.testing.stub_config import StubConfig
from cupid_exp.testing.stub_faults import CONTEXT_ERRORS, answer, choose_fault, error_reply, no_completion
from cupid_exp.testing.stub_llm_server import StubModel, _Counters
from cupid_exp.testing.stub_replies import digest

PROVIDER = "inproc"
#: what the provider answers: these knobs' faults, and whatever ``StubConfig`` does not make a fault of
FAULTS = ("429", "500", "503", "empty_choices", "content_null", "context_length")
#: knobs whose faults need the wire or a server (``stub_llm_server``): refused here, never silently ignored
_WIRE_KNOBS = ("rate_slow", "rate_malformed", "echo_key_steps", "rpm", "tpm", "closed_s", "refuse", "outage_s",
               "record_headers", "rate_limit_style")

_MODELS: dict[str, InProcessModel] = {}  # name -> the model serving ``inproc/<name>`` now
_REGISTERED = threading.Lock()


class InProcessModel(StubModel):
    """The stand-in model for ``inproc/<name>``, while its ``with`` block lasts (one per name at a time)."""

    def __init__(self, config: StubConfig | None = None, *, name: str = "stub", **overrides: object):
        super().__init__(config, overrides)
        self.name = name
        knobs, faults = self.config.knobs(), self.config.faults
        wire = [k for k in _WIRE_KNOBS if knobs[k]]
        wire += [k for k in faults.fail_first_kind.split(",") if faults.fail_first and k not in FAULTS]
        if wire:
            raise ValueError(f"{', '.join(wire)}: needs the wire; use cupid_exp.testing.stub_llm_server.StubServer")

    @property
    def litellm_model(self) -> str:
        return f"{PROVIDER}/{self.name}"

    def overrides(self) -> list[str]:
        """Hydra overrides that send the subject model and every evaluator role here."""
        return stub_overrides("null", self.litellm_model)

    def __enter__(self) -> InProcessModel:
        _register()
        with _REGISTERED:
            if self.name in _MODELS:
                raise RuntimeError(f"{self.litellm_model} is already served by another InProcessModel")
            _MODELS[self.name] = self
        return self

    def __exit__(self, *exc: object) -> None:
        with _REGISTERED:
            _MODELS.pop(self.name, None)

    def reset(self) -> None:
        with self._lock:
            self.counters, self._seen = _Counters(), Counter()

    def reconfigure(self, **changes: object) -> None:
        """Switch faults on or off between two runs; the counters are kept."""
        with self._lock:
            self.config.set(**changes)

    def stats(self) -> dict[str, Any]:
        """The stub's counters (``StubServer.stats``) that mean something without the wire."""
        with self._lock:
            return self.counters.stats()

    # ---- serving one request

    def _reply(self, body: dict[str, Any], step: str, fault: str | None) -> "litellm.ModelResponse":
        """The reply (a litellm ``ModelResponse``) or the provider's error raised, counted as the stub counts."""
        import litellm

        try:
            if fault in FAULTS:
                with self._lock:
                    self.counters.faults[step][fault] += 1
            if fault in ("429", "500", "503", "context_length"):
                raise _error(fault, self.config, self.litellm_model)
            if fault in ("empty_choices", "content_null"):
                return litellm.ModelResponse(**self._billed(body, no_completion(fault, body)))
            full, cut = answer(self.config, step, body)
            reply = self._billed(body, full)
            with self._lock:
                if cut:
                    self.counters.faults[step]["length"] += 1
                self.counters.answered(step, digest(json.dumps(body, sort_keys=True)), full["usage"])
            return litellm.ModelResponse(**reply)
        finally:
            with self._lock:  # answered or failed: no longer in flight
                self.counters.flight.change(-1)


def _error(fault: str, cfg: StubConfig, model: str) -> Exception:
    """The litellm exception a provider's ``fault`` reaches our client as (the stub's status, body and headers)."""
    import litellm

    if fault == "context_length":
        _, payload = CONTEXT_ERRORS[cfg.replies.context_error or "openai"]
        return litellm.ContextWindowExceededError(message=json.dumps(payload), model=model, llm_provider=PROVIDER)
    _, payload, headers, _ = error_reply(fault, cfg)
    message = str(payload["error"]["message"])
    kind = {"429": litellm.RateLimitError, "503": litellm.ServiceUnavailableError}.get(fault,
                                                                                       litellm.InternalServerError)
    error = kind(message=message, llm_provider=PROVIDER, model=model)
    error.litellm_response_headers = headers  # where litellm keeps a provider's headers (a 429's retry-after)
    return error


def _receive(name: str, messages: list[Any], optional_params: dict[str, Any]
             ) -> tuple[InProcessModel, dict[str, Any], str, float, str | None]:
    """The model serving ``inproc/<name>`` now, and the request counted there: (model, body, step, the latency to
    wait, the fault it gets)."""
    with _REGISTERED:
        served = _MODELS.get(name)
    if served is None:
        raise ValueError(f"no InProcessModel serves {PROVIDER}/{name} now (use it as a context manager)")
    body = {"model": name, "messages": messages, **optional_params}
    with served._lock:
        step, prompt_digest, attempt, delay = served._arrive(body)
    return served, body, step, delay, choose_fault(served.config, step, prompt_digest, attempt, body)


_HANDLER: object = None


def _register() -> None:
    """One litellm handler for every ``inproc/<name>``, registered the way the embedded models are."""
    global _HANDLER
    import litellm

    from cupid_exp.llm import _litellm

    if _HANDLER is not None and any(p.get("custom_handler") is _HANDLER for p in litellm.custom_provider_map):
        return

    class _Handler(litellm.CustomLLM):
        def completion(self, model: str, messages: list[Any], optional_params: dict[str, Any],
                       **kwargs: object) -> "litellm.ModelResponse":  # litellm passes every argument by name
            served, body, step, delay, fault = _receive(model, messages, optional_params)
            time.sleep(delay)
            return served._reply(body, step, fault)

        async def acompletion(self, model: str, messages: list[Any], optional_params: dict[str, Any],
                              **kwargs: object) -> "litellm.ModelResponse":
            served, body, step, delay, fault = _receive(model, messages, optional_params)
            try:
                await asyncio.sleep(delay)
            except BaseException:  # cancelled while "on the wire": no longer in flight
                with served._lock:
                    served.counters.flight.change(-1)
                raise
            return served._reply(body, step, fault)

    _HANDLER = _Handler()
    _litellm.register_custom_provider(PROVIDER, _HANDLER)
