"""What to do with a failed request: wait and retry, retry a bounded number of times, give up, or stop the job.

litellm's own retries honour only a short ``retry-after`` and hide 429s, so the client turns them off and
decides here: a 429 is waited out as long as the provider says, until ``calls.rate_limit_patience_s``; a
transient failure is retried ``calls.num_retries`` times with full-jitter backoff; a refusal retrying cannot fix
raises ``FatalProviderError`` (exit 2); a wait longer than the patience left raises ``RetryLater`` (exit 75); an
outage pauses the pool while one probe at a time asks whether it is back (``Pool.went_down``), until
``calls.outage_patience_s``; anything else (a context window, a 400) fails the call at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import random
import re
import socket
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, AsyncContextManager, Awaitable, Callable, Mapping

from cupid_exp.errors import causes
from cupid_exp.llm.errors import provider_error_kind

if TYPE_CHECKING:
    from cupid_exp.llm.client import LLMClient
    from cupid_exp.llm.pools import Pool

# Retry classes of a provider failure (``decide``).
RATE_LIMIT, TRANSIENT, FATAL, FINAL = "rate_limit", "transient", "fatal", "final"

BACKOFF_BASE_S, BACKOFF_CAP_S = 0.5, 60.0
RATE_LIMIT_BASE_S = 1.0  # a 429 without any hint: 1, 2, 4 ... s (full jitter), at most BACKOFF_CAP_S
REFUSED_BEFORE_FATAL = 3  # connection refusals, with no success ever, that make an endpoint unreachable

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_TRY_AGAIN = re.compile(r"try again in ((?:\d+(?:\.\d+)?(?:ms|h|m|s))+)(?![a-z])", re.IGNORECASE)
# OpenAI's billing states (``error.code`` or ``error.type``, mostly sent as a 429): no wait brings the money back
BILLING_CODES = ("insufficient_quota", "credit_balance_exhausted", "organization_usage_limit_exceeded")
BILLING_SUFFIX = "_spend_limit_exceeded"  # organization_..., project_...


@dataclass
class JobStop:
    """Shared by the clients of one job: the first fatal refusal, after which none of them sends another request
    (calls already in flight finish; ``cupid_exp.llm.client.clients_for``)."""

    fatal: FatalProviderError | None = None


def stop_job(fatal: FatalProviderError, endpoint: Pool, stop: JobStop) -> FatalProviderError:
    """``fatal`` as the endpoint's and the job's stop, where none came first; the job's stop (the first one)."""
    if endpoint.fatal is None:
        endpoint.fatal = fatal
    if stop.fatal is None:
        stop.fatal = fatal
    return stop.fatal


class FatalProviderError(Exception):
    """A provider's refusal that no retry and no other instance can get past (bad key, unknown model, no
    endpoint): the job stops starting instances and exits 2 with this one line. Not a ``ProviderError``, so
    no step records it as an instance's failure and a resume tries again."""

    def __init__(self, model: str, kind: str, message: str, roles: tuple[str, ...] = ()):
        self.model, self.kind, self.message, self.roles = model, kind, message, tuple(roles)
        super().__init__(self.line())

    outcome = "error"  #: how the job ends (``cupid_exp.entry.Outcome``): exit 2
    resume = "fix it and run the same command to resume"

    def line(self) -> str:
        who = ", ".join(self.roles) or "a role"
        return (f"stopped: {who} (model {self.model}): {self.kind}: {self.message}; no new instance was started, "
                f"finished ones are journaled: {self.resume}")

    def __reduce__(self) -> tuple[Any, ...]:  # crosses from a worker process to the job's
        return FatalProviderError, (self.model, self.kind, self.message, self.roles)


class RetryLater(FatalProviderError):
    """A rate limit that outlasts ``calls.rate_limit_patience_s`` (a daily limit asks for hours; or the patience
    is used up): the job stops as on a fatal refusal (no new instance, those in flight unjournaled, not failed) and
    exits 75 (``cupid_exp.entry.EXIT_RETRY_LATER``): the same command, later, resumes it."""

    outcome = "retry_later"
    resume = "run the same command later to resume"

    def __init__(self, model: str, kind: str, message: str, roles: tuple[str, ...] = (), wait_s: float = 0.0):
        self.wait_s = wait_s
        super().__init__(model, kind, message, roles)

    def __reduce__(self) -> tuple[Any, ...]:
        return RetryLater, (self.model, self.kind, self.message, self.roles, self.wait_s)


def parse_duration(text: str) -> float | None:
    """Seconds in OpenAI's reset format (``1.2s``, ``6m0s``, ``20ms``, ``1h2m3s``) or a bare number of seconds."""
    text = text.strip().lower()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text.replace(" ", ""):
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * scale[u] for n, u in parts)


def _until(text: str, now: float) -> float | None:
    """Seconds until an RFC 3339 time (Anthropic's resets) or an HTTP date (``Retry-After``'s other form)."""
    text = text.strip()
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text).timestamp()
        except (TypeError, ValueError, IndexError):
            return None
    return max(0.0, when - now)


def retry_after_s(headers: Mapping[str, str] | None, body_message: str = "", now: float | None = None
                  ) -> float | None:
    """How long the provider asks to wait, from its headers (any value, not only under 60 s), else from its
    message ("Please try again in 1.2s"); None when it says nothing.

    ``retry-after-ms`` first, then ``retry-after`` (seconds or an HTTP date), then the latest of the
    ``x-ratelimit-reset-*`` (OpenAI: ``1.2s``, ``6m0s``) and ``anthropic-ratelimit-*-reset`` (RFC 3339) resets.
    """
    now = time.time() if now is None else now
    h = {str(k).lower(): str(v) for k, v in (headers or {}).items()}
    if "retry-after-ms" in h and (ms := parse_duration(h["retry-after-ms"])) is not None:
        return ms / 1000
    if "retry-after" in h:
        value = parse_duration(h["retry-after"])
        if value is None:
            value = _until(h["retry-after"], now)
        if value is not None:
            return value
    resets: list[float | None] = []
    for key, text in h.items():
        if key.startswith("x-ratelimit-reset"):
            resets.append(parse_duration(text))
        elif key.startswith("anthropic-ratelimit-") and key.endswith("-reset"):
            resets.append(_until(text, now))
    known = [r for r in resets if r is not None]
    if known:
        return max(known)
    match = _TRY_AGAIN.search(body_message or "")  # "1.2s", "350ms", a daily limit's "7m12s" or "1h0m0s"
    return parse_duration(match.group(1)) if match else None


def told_limits(headers: Mapping[str, str] | None) -> tuple[float | None, float | None]:
    """(requests, tokens) per minute a provider says the key has (``x-ratelimit-limit-*`` or
    ``anthropic-ratelimit-*-limit``), for pacing when the config names none."""
    h = {str(k).lower(): str(v) for k, v in (headers or {}).items()}

    def number(*keys: str) -> float | None:
        for key in keys:
            try:
                value = float(h[key])
            except (KeyError, ValueError):
                continue
            if value > 0:
                return value
        return None

    return (number("x-ratelimit-limit-requests", "anthropic-ratelimit-requests-limit"),
            number("x-ratelimit-limit-tokens", "anthropic-ratelimit-tokens-limit",
                   "anthropic-ratelimit-input-tokens-limit"))


def headers_of(exc: BaseException) -> dict[str, str]:
    """The HTTP headers a litellm/OpenAI exception carries (``litellm_response_headers`` or ``response``)."""
    for source in (getattr(exc, "litellm_response_headers", None),
                   getattr(getattr(exc, "response", None), "headers", None)):
        if source:
            try:
                return {str(k).lower(): str(v) for k, v in dict(source).items()}
            except (TypeError, ValueError):
                continue
    return {}


def provider_code(exc: BaseException, field: str = "code") -> str | None:
    """The ``error.code`` (or another ``field``) of an OpenAI-style error body (``invalid_api_key``,
    ``model_not_found`` ...)."""
    body = getattr(exc, "body", None)
    if not isinstance(body, dict):
        try:
            body = json.loads(getattr(getattr(exc, "response", None), "text", "") or "{}")
        except (TypeError, ValueError):
            return None
    error = body.get("error", body) if isinstance(body, dict) else None
    code = error.get(field) if isinstance(error, dict) else None
    return str(code) if code is not None else None


def is_billing(name: str | None) -> bool:
    """Whether ``name`` (an error code or type) is a billing state: no wait brings the money back."""
    return name is not None and (name in BILLING_CODES or name.endswith(BILLING_SUFFIX) and name != BILLING_SUFFIX)


def billing_state(exc: BaseException) -> str | None:
    """The billing state a refusal names (``insufficient_quota``, ``project_spend_limit_exceeded`` ...), if any:
    OpenAI puts it in ``error.code`` or ``error.type``; litellm's message keeps it when the body is gone."""
    words: list[str] = re.findall(r"[a-z_]+", str(exc))
    return next((n for n in [provider_code(exc), provider_code(exc, "type"), *words] if is_billing(n)), None)


def backoff_s(attempt: int, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2**attempt)] (callers retry apart)."""
    return random.uniform(0, min(cap, base * 2 ** min(attempt, 30)))


def is_connection_refused(exc: BaseException) -> bool:
    """No connection could be made at all (refused, unknown host): not a timeout, not a dropped connection."""
    return any(isinstance(e, (ConnectionRefusedError, socket.gaierror))
               or type(e).__name__ in ("ConnectError", "ClientConnectorError") for e in causes(exc))


_DROPPED = ("ConnectError", "ClientConnectorError", "RemoteProtocolError", "ReadError", "WriteError",
            "ServerDisconnectedError", "ClientOSError")  # httpx's and aiohttp's names for a connection gone


def is_connection_failure(exc: BaseException) -> bool:
    """No answer at all: the connection refused, reset or closed unanswered, the host unknown (not a timeout)."""
    return any(isinstance(e, (ConnectionError, socket.gaierror)) or type(e).__name__ in _DROPPED for e in causes(exc))


def is_outage_failure(exc: BaseException) -> bool:
    """A failure an outage gives every request alike: no connection, or a 5xx (a proxy's 502/503/504 included)."""
    status = getattr(exc, "status_code", None)
    if type(exc).__name__ in ("Timeout", "APITimeoutError") or isinstance(exc, TimeoutError):
        return False  # a slow reply is the request's, not a sign the endpoint is gone
    if is_connection_failure(exc):
        return True
    return isinstance(status, int) and status >= 500 and type(exc).__name__ != "APIConnectionError"


@dataclass(frozen=True)
class Decision:
    what: str  #: RATE_LIMIT, TRANSIENT, FATAL or FINAL
    kind: str  #: the failure kind counted when the call fails (``errors.provider_error_kind``'s, or fatal's)


def decide(exc: BaseException, kind: str) -> Decision:
    """What to do with a provider failure of ``kind`` (``cupid_exp.llm.client.provider_error_kind``)."""
    import litellm

    status = getattr(exc, "status_code", None)
    code = provider_code(exc)
    billing = billing_state(exc) if isinstance(status, int) and status >= 400 else None
    if billing is not None:  # out of credit, a spend limit: waiting does not bring it back
        return Decision(FATAL, billing)
    if kind == "rate_limit" or status == 429:
        return Decision(RATE_LIMIT, "rate_limit")
    if kind == "auth" or status in (401, 403):
        return Decision(FATAL, "auth")
    if isinstance(exc, litellm.NotFoundError) or status == 404 or code == "model_not_found":
        return Decision(FATAL, "model_not_found")
    if kind in ("timeout",):
        return Decision(TRANSIENT, kind)
    if kind == "context_length" or (isinstance(status, int) and 400 <= status < 500 and status not in (408, 409)):
        return Decision(FINAL, kind)
    return Decision(TRANSIENT, kind)  # 5xx, dropped connections, malformed bodies


@dataclass
class Attempts:
    """What one call went through before its last request: counted in the usage meter."""

    retries: int = 0  #: requests repeated after a transient failure (bounded by calls.num_retries)
    rate_limited: int = 0  #: requests repeated after a 429 (bounded by calls.rate_limit_patience_s)
    wait_s: float = 0.0  #: seconds waited on rate limits: 429s, the endpoint's pause, the pacer


class CallFailed(Exception):
    """A call that failed for good (not fatal): its kind, the provider's exception and what it went through."""

    def __init__(self, kind: str, cause: BaseException, attempts: Attempts, reason: str = "", fatal: bool = False):
        self.kind, self.cause, self.attempts, self.reason, self.fatal = kind, cause, attempts, reason, fatal
        super().__init__(reason or str(cause))


async def with_retries(send: Callable[[], Awaitable[Any]], client: LLMClient, *, tokens: int,
                       before: Callable[[], Awaitable[None]] | None = None,
                       gate: AsyncContextManager[Any] | None = None) -> tuple[Any, Attempts]:
    """``send()`` once per attempt inside the slot of ``client``'s pool, under its ``calls.*`` settings, until a reply,
    a final failure (``CallFailed``), a fatal refusal (``FatalProviderError``) or a bug (raised unchanged).
    ``before()`` runs ahead of each attempt, outside the slot: the attempt's budget reservation, which may wait for
    others' to come back (a slot held while waiting could be the one a reservation's own request needs). ``gate``:
    the caller's own bound on calls at once (a role's ``max_concurrency``), held for each attempt and let go while
    the call waits out a 429's retry-after or a backoff: a refused call does not keep a ready one from being sent."""
    endpoint, stop, model, roles, scrub = client.pool, client.stop, client.model.name, client.roles, client._scrub
    num_retries, patience_s = client.settings.num_retries, client.settings.rate_limit_patience_s
    outage_patience_s = client.settings.outage_patience_s
    attempts = Attempts()
    started = time.monotonic()
    call = object()  # this call, among those whose failures make up the pool's run of failures
    while True:
        async with gate if gate is not None else contextlib.nullcontext():
            held = None
            if stop.fatal is not None:
                raise stop.fatal  # the job stops: no new request, whichever endpoint
            if endpoint.fatal is not None:
                raise endpoint.fatal  # another call found the endpoint refusing: not sent
            if before is not None:
                await before()
            try:
                async with endpoint.slot(tokens, stop) as held:
                    attempts.wait_s += held.seconds
                    response = await send()
            except Exception as exc:  # noqa: BLE001  # sorted right below: a provider's failure vs a bug
                kind = provider_error_kind(exc)
                if kind is None:
                    raise
                decision = decide(exc, kind)
                outage = decision.what == TRANSIENT and is_outage_failure(exc)
                if outage:
                    endpoint.no_answer(call)
                elif endpoint.outage.down_since is not None and kind != "timeout" and isinstance(getattr(
                        exc, "status_code", None), int):
                    endpoint.answers()  # a 429 or a 400 is an answer: the endpoint is back
                if decision.what == TRANSIENT and is_connection_refused(exc):
                    endpoint.total.refused += 1
                    if endpoint.total.refused >= REFUSED_BEFORE_FATAL and not endpoint.has_answered(outage_patience_s):
                        decision = Decision(FATAL, "unreachable")
                if decision.what == FATAL:
                    stop_job(endpoint.fatal or FatalProviderError(model, decision.kind, scrub(_message(exc)), roles),
                             endpoint, stop)
                    raise CallFailed(decision.kind, exc, attempts, fatal=True) from exc
                headers = headers_of(exc)
                hint = retry_after_s(headers, str(exc))
                if decision.what == RATE_LIMIT:
                    wait = hint if hint is not None else backoff_s(attempts.rate_limited, RATE_LIMIT_BASE_S)
                    spent = time.monotonic() - started
                    if spent + wait > patience_s:  # the job stops: every instance would spend a request to learn it
                        endpoint.rate_limited(told_limits(headers), None, wait)  # counted, never a pause
                        words = scrub(_beyond_patience(exc, hint, wait, spent, patience_s))
                        stop_job(RetryLater(model, "rate_limit", words, roles, wait), endpoint, stop)
                        raise CallFailed("rate_limit", exc, attempts, fatal=True) from exc
                    # the pace learned, every caller of the pool paused as the provider asks (not when the job stops
                    # on it: callers held by an hour's pause would not see the stop)
                    endpoint.rate_limited(told_limits(headers), hint, wait)
                    attempts.rate_limited += 1
                elif outage and (endpoint.outage.down_since is not None or (
                        attempts.retries >= num_retries and endpoint.went_down(
                            call, is_connection_failure(exc), hint, scrub(_message(exc)), outage_patience_s))):
                    # the pool's outage, not this call's failure: it waits in the pool's slot with every other caller
                    # while one probe at a time asks whether the endpoint is back (``Pool.slot``)
                    if held is not None and held.probe and not endpoint.probe_failed(hint, outage_patience_s):
                        stop_job(RetryLater(model, "unreachable", scrub(_outage_over(endpoint, exc, outage_patience_s)),
                                            roles), endpoint, stop)
                        raise CallFailed("unreachable", exc, attempts, fatal=True) from exc
                    attempts.retries += 1  # sent again (a probe, or after the pause): a request counted like any retry
                    continue
                elif decision.what == TRANSIENT and attempts.retries < num_retries:
                    wait = hint if hint is not None else backoff_s(attempts.retries)
                    attempts.retries += 1
                else:
                    raise CallFailed(decision.kind, exc, attempts) from exc
                attempts.wait_s += wait if decision.what == RATE_LIMIT else 0.0
            else:
                endpoint.succeeded(response)
                return response, attempts
        await asyncio.sleep(wait)  # out of the gate: another ready call takes its place meanwhile


def _beyond_patience(exc: BaseException, hint: float | None, wait: float, spent: float, patience_s: float) -> str:
    """The stop's words: the wait asked, what is left of the patience, and the provider's own message (which names
    the limit: "requests per day", "tokens per min")."""
    asked = (f"the provider asks to wait {wait:.0f} s" if hint is not None
             else f"still refused, next try in {wait:.1f} s")
    return (f"{asked}, more than the {max(0.0, patience_s - spent):.0f} s left of calls.rate_limit_patience_s="
            f"{patience_s:g} (rate-limited for {spent:.0f} s so far): {_message(exc)}")


def _outage_over(endpoint: Pool, exc: BaseException, patience_s: float) -> str:
    """The stop's words when the endpoint did not come back within the patience (its outage has begun)."""
    down = endpoint.outage.down_since or time.time()
    since = time.strftime("%H:%M:%S", time.localtime(down))
    return (f"provider {endpoint.label} has not answered since {since} ({time.time() - down:.0f} s, "
            f"calls.outage_patience_s={patience_s:g}): {_message(exc)}")


def _message(exc: BaseException, n: int = 300) -> str:
    """The provider's own words, on one line (litellm prefixes its class names)."""
    text = " ".join(str(exc).split())
    text = re.sub(r"^litellm\.\w+:\s*(\w+:\s*)?(OpenAIException\s*-\s*)?", "", text)
    status = getattr(exc, "status_code", None)
    code = provider_code(exc)
    prefix = " ".join(str(p) for p in (status, code) if p)
    text = f"{prefix}: {text}" if prefix else text
    return text if len(text) <= n else text[: n - 1] + "…"
