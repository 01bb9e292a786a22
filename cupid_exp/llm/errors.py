"""Which failures are the provider's (counted per instance, the run goes on) and which are bugs (the job stops)."""

from __future__ import annotations

import asyncio

from cupid_exp.errors import causes


class ProviderError(RuntimeError):
    """A model call that failed after retries; ``kind`` classifies it for the failure counts."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(message)


class EmptyReply(Exception):
    """A reply with no completion, retried like a 5xx; ``status_code`` 422: rejected twice, not retryable."""

    def __init__(self, message: str, status_code: int | None = None):
        self.status_code = status_code
        super().__init__(message)


_CONTEXT_PHRASES = ("context_length_exceeded", "context length", "maximum context", "too many tokens",
                    "prompt is too long", "input is too long", "exceeds n_ctx", "exceed_context_size")


# Python's own programming errors. Raised anywhere but inside the HTTP/provider libraries (where they mean a
# reply litellm could not digest, e.g. a malformed body), they are bugs: ours, a custom provider's, a missing module.
_PROGRAMMING_ERRORS = (TypeError, AttributeError, NameError, KeyError, IndexError, AssertionError,
                       NotImplementedError, ZeroDivisionError, RecursionError, ImportError)
_PROVIDER_LIBRARIES = {"litellm", "openai", "httpx", "httpcore", "h11", "aiohttp", "anyio"}


def _is_bug(exc: BaseException) -> bool:
    """A programming error, unless it was raised inside a provider library digesting a reply."""
    if isinstance(exc, ImportError):
        return True  # a missing dependency is never the provider's fault
    if not isinstance(exc, _PROGRAMMING_ERRORS):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
    return module.split(".")[0] not in _PROVIDER_LIBRARIES


def provider_error_kind(exc: BaseException) -> str | None:
    """The failure kind of a provider's error, or None for a bug that must stop the job. litellm wraps in-process errors
    as APIConnectionError, so the chain is read: a TypeError of ours is a bug whatever wraps it."""
    import litellm
    import openai

    if isinstance(exc, EmptyReply):
        return "provider"
    provider_types = (*litellm.LITELLM_EXCEPTION_TYPES, openai.APIError, asyncio.TimeoutError)
    if not isinstance(exc, provider_types) or any(_is_bug(inner) for inner in causes(exc)):
        return None
    if isinstance(exc, litellm.ContextWindowExceededError) or any(p in str(exc).lower() for p in _CONTEXT_PHRASES):
        return "context_length"
    if isinstance(exc, (litellm.Timeout, asyncio.TimeoutError)):
        return "timeout"
    if isinstance(exc, litellm.RateLimitError):
        return "rate_limit"
    if isinstance(exc, (litellm.AuthenticationError, litellm.PermissionDeniedError)) or getattr(
            exc, "status_code", None) in (401, 403):
        return "auth"
    return "provider"


def _short(exc: BaseException, n: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= n else text[: n - 1] + "…"
