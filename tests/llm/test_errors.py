"""Only a provider's errors are counted as failed calls; a bug (ours, a custom provider's, a missing
module) propagates out of the client, whatever litellm wrapped it in."""

from __future__ import annotations

import asyncio

import litellm
import pytest

from cupid_exp.config import CallsConfig, ModelConfig, RuntimeConfig
from cupid_exp.llm import _litellm
from cupid_exp.llm.client import LLMClient, ProviderError, configure_litellm, provider_error_kind
from cupid_exp.llm.retry import FatalProviderError, RetryLater
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.testing.fault_server import ScriptedServer, completion_body

MESSAGES = [{"role": "user", "content": "hi"}]


def runtime(tmp_path, **kw) -> RuntimeConfig:
    rt = CallsConfig(cache_dir=str(tmp_path / "cache"), num_retries=0, timeout=10, **kw)
    configure_litellm(rt)
    return rt


class _Faulty(litellm.CustomLLM):
    """Injects one exception from inside an in-process provider (litellm wraps it as APIConnectionError)."""

    def __init__(self, exc: BaseException):
        super().__init__()
        self.exc = exc

    async def acompletion(self, *args, **kwargs):
        raise self.exc

    def completion(self, *args, **kwargs):
        raise self.exc


def faulty_client(tmp_path, exc: BaseException, name: str) -> tuple[LLMClient, UsageMeter]:
    _litellm.register_custom_provider(name, _Faulty(exc))
    meter = UsageMeter()
    return LLMClient(ModelConfig(name=name, litellm_model=f"{name}/m"), runtime(tmp_path, cache=False), meter), meter


@pytest.mark.parametrize("exc", [TypeError("bad argument"), AttributeError("no such field"), KeyError("label"),
                                 ModuleNotFoundError("No module named 'orjson'")])
def test_a_bug_inside_a_provider_propagates_uncounted(tmp_path, exc) -> None:
    client, meter = faulty_client(tmp_path, exc, f"faulty{type(exc).__name__.lower()}")
    with pytest.raises(Exception) as raised:
        asyncio.run(client.complete(MESSAGES, step="s"))
    assert not isinstance(raised.value, ProviderError)
    chain = [raised.value, raised.value.__cause__, raised.value.__context__]
    assert any(type(e) is type(exc) for e in chain) or str(exc) in str(raised.value)
    assert not any(k.startswith("failed_") for k in meter.as_dict().get("s", {}))


def test_a_missing_module_on_the_cache_hit_path_stops_the_call(tmp_path, monkeypatch) -> None:
    """The orjson case: litellm's cache path imported a module the environment lacked."""
    rt = runtime(tmp_path)
    with ScriptedServer([(200, completion_body("hello"), {})]) as server:
        model = ModelConfig(name="c", litellm_model="openai/scripted", api_base=server.url)
        client = LLMClient(model, rt, UsageMeter())
        asyncio.run(client.complete(MESSAGES, step="s"))

        async def broken_get(*args, **kwargs):
            raise ModuleNotFoundError("No module named 'orjson'")

        monkeypatch.setattr(litellm.cache, "async_get_cache", broken_get)
        with pytest.raises(ModuleNotFoundError, match="orjson"):
            asyncio.run(client.complete(MESSAGES, step="s"))


@pytest.mark.parametrize("status,headers,kind,error", [
    (500, {}, "provider", ProviderError), (503, {}, "provider", ProviderError),
    (429, {"retry-after": "0"}, "rate_limit", RetryLater),  # after the (short) patience: the job stops for later
    (400, {}, "provider", ProviderError),
    (401, {}, "auth", FatalProviderError), (403, {}, "auth", FatalProviderError),  # the job stops: cupid_exp.llm.retry
])
def test_every_http_failure_is_a_counted_provider_error(tmp_path, status, headers, kind, error) -> None:
    with ScriptedServer([(status, {"error": {"message": "no"}}, headers)]) as server:
        meter = UsageMeter()
        client = LLMClient(ModelConfig(name=f"h{status}", litellm_model="openai/scripted", api_base=server.url),
                           runtime(tmp_path, cache=False, rate_limit_patience_s=1.0), meter)
        with pytest.raises(error) as err:
            asyncio.run(client.complete(MESSAGES, step="s"))
    if error is ProviderError:
        assert err.value.kind == kind
    assert meter.as_dict()["s"][f"failed_{kind}"] == 1


def test_a_malformed_reply_is_the_providers_fault_not_a_bug(tmp_path) -> None:
    with ScriptedServer([(200, b'{"id": "x", "choices": [', {})]) as server:
        client = LLMClient(ModelConfig(name="garbled", litellm_model="openai/scripted", api_base=server.url),
                           runtime(tmp_path, cache=False), UsageMeter())
        with pytest.raises(ProviderError):
            asyncio.run(client.complete(MESSAGES, step="s"))


def test_the_classifier_on_exceptions_directly() -> None:
    assert provider_error_kind(TypeError("x")) is None
    assert provider_error_kind(asyncio.TimeoutError()) == "timeout"
    wrapped = litellm.APIConnectionError(message="boom", llm_provider="x", model="m")
    assert provider_error_kind(wrapped) == "provider"
    try:
        try:
            raise ImportError("No module named 'somewhere'")
        except ImportError:
            raise wrapped  # noqa: B904 - the implicit context (not a cause) is what this case feeds the classifier
    except litellm.APIConnectionError as exc:
        assert provider_error_kind(exc) is None
    window = litellm.ContextWindowExceededError(message="too long", model="m", llm_provider="x")
    assert provider_error_kind(window) == "context_length"
