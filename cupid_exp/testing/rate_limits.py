"""A key's limits as the OpenAI API enforces them, for the stub server (``stub_llm_server.py --rpm/--tpm``).

- RPM and TPM per model, in one-second windows each adding a 60th of the limit: a request is admitted while its
  window has any left (its excess is owed by the next ones). A request counts its prompt (characters / 4, as the
  stub's ``usage``) plus its ``max_tokens``; a refused one counts nothing.
- ``bucket="continuous"``: a token bucket of one second's share instead, refilled continuously; its headers follow
  the bucket (``remaining``: what it holds, ``reset``: until full, a 429's ``retry-after-ms``: until the cost is there).
- Admitted replies carry ``x-ratelimit-limit/remaining/reset-*`` (``stated``); a 429 adds ``retry-after``,
  ``retry-after-ms`` and OpenAI's body ("Please try again in 1.2s", ``type`` requests or tokens).
- ``pool="key"``: one pool for every model of the key (a proxy, or OpenAI's shared limit of a model family).
- ``headers="retry-after"``: a 429 states only ``retry-after`` in whole seconds, as many proxies do.
- ``closed_s``: every request 429 for that long from the first one (``inf``: for ever).
- ``refuse``: every request refused as OpenAI refuses a bad key (401), a region (403), an unknown model (404), an
  account out of credit (429 ``insufficient_quota``) or a key past its requests per day (``daily``).

``ideal_s``: per pool, the sum of each admitted request's share of the binding limit; the largest is the least wall
time the admitted work could take.
"""

from __future__ import annotations

import email.utils
import json
import math
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from cupid_exp.testing.stub_replies import prompt_tokens

REFUSALS: dict[str, tuple[int, dict[str, Any]]] = {
    "401": (401, {"error": {"message": "Incorrect API key provided: sk-stub***********abcd. You can find your API key "
                                       "at https://platform.openai.com/account/api-keys.",
                            "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}),
    "403": (403, {"error": {"message": "Country, region, or territory not supported",
                            "type": "request_forbidden", "param": None,
                            "code": "unsupported_country_region_territory"}}),
    "404": (404, {"error": {"message": "The model `{model}` does not exist or you do not have access to it.",
                            "type": "invalid_request_error", "param": None, "code": "model_not_found"}}),
    "insufficient_quota": (429, {"error": {
        "message": "You exceeded your current quota, please check your plan and billing details. For more "
                   "information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes.",
        "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}}),
    "daily": (429, {"error": {
        "message": "Rate limit reached for {model} in organization org-stub on requests per day (RPD): Limit 200, "
                   "Used 200, Requested 1. Please try again in 1h0m0s. Visit "
                   "https://platform.openai.com/account/rate-limits to learn more.",
        "type": "requests", "param": None, "code": "rate_limit_exceeded"}}),
}
REFUSAL_HEADERS = {"daily": {"retry-after": "3600", "x-ratelimit-limit-requests": "10000",
                             "x-ratelimit-reset-requests": "1h0m0s"}}


def refusal(kind: str, model: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) of the refusal ``kind`` (one of ``REFUSALS``) for ``model``."""
    status, payload = REFUSALS[kind]
    return status, json.loads(json.dumps(payload).replace("{model}", model)), dict(REFUSAL_HEADERS.get(kind, {}))


# How providers say how long to wait after a 429 (``rate_limit_reply``); the client must honour each.
RATE_LIMIT_STYLES = ("retry-after", "retry-after-ms", "http-date", "x-ratelimit-reset", "anthropic-reset", "body",
                     "none")


def rate_limit_reply(style: str, wait_s: float, now: float | None = None
                     ) -> tuple[dict[str, Any], dict[str, str], float]:
    """(body, headers, the wait they ask) of a 429 that says ``wait_s`` in ``style`` (one of ``RATE_LIMIT_STYLES``):
    ``retry-after`` in whole seconds, ``retry-after-ms``, ``retry-after`` as an HTTP date (whole seconds, so the wait
    asked is what is left to that second), OpenAI's ``x-ratelimit-reset-*`` (``1.2s``), Anthropic's RFC 3339
    ``anthropic-ratelimit-requests-reset``, only the message's "Please try again in 1.2s", or nothing (0: the
    client's own backoff)."""
    now = time.time() if now is None else now
    said = f" Please try again in {openai_duration(wait_s)}." if style != "none" else ""
    body = {"error": {"message": f"Rate limit reached for requests.{said}", "type": "requests", "param": None,
                      "code": "rate_limit_exceeded"}}
    asked, headers = wait_s, {}
    if style == "retry-after":
        asked = float(math.ceil(wait_s))
        headers = {"retry-after": str(int(asked))}
    elif style == "retry-after-ms":
        headers = {"retry-after-ms": str(max(1, round(wait_s * 1000)))}
    elif style == "http-date":
        when = math.ceil(now + wait_s)
        asked, headers = when - now, {"retry-after": email.utils.formatdate(when, usegmt=True)}
    elif style == "x-ratelimit-reset":
        headers = {"x-ratelimit-reset-requests": openai_duration(wait_s), "x-ratelimit-reset-tokens": "1ms"}
    elif style == "anthropic-reset":
        headers = {"anthropic-ratelimit-requests-reset":
                   datetime.fromtimestamp(now + wait_s, timezone.utc).isoformat().replace("+00:00", "Z")}
    elif style == "none":
        asked = 0.0
    elif style != "body":
        raise ValueError(f"rate-limit style {style!r}: one of {RATE_LIMIT_STYLES}")
    return body, headers, asked


def openai_duration(seconds: float) -> str:
    """OpenAI's reset format: ``20ms``, ``1.2s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.0f}s"


class _Window:
    """One per-minute limit spent in one-second windows."""

    def __init__(self, per_minute: float):
        self.per_minute, self.per_window = per_minute, per_minute / 60.0
        self.window, self.level = 0, 0.0

    def _drain(self, now: float) -> None:
        window = int(now)
        if window > self.window:
            self.level = max(0.0, self.level - self.per_window * (window - self.window))
            self.window = window

    def fits(self, cost: float, now: float) -> bool:
        """While this window has any of its share left (a larger request's excess carries to the next)."""
        self._drain(now)
        return self.level < self.per_window - 1e-9

    def spend(self, cost: float) -> None:
        self.level += cost

    def reset_s(self, cost: float, now: float) -> float:
        """Seconds until a window has some of its share left."""
        windows = math.floor((self.level - self.per_window) / self.per_window) + 1
        return max(0.001, self.window + max(1, windows) - now)

    def remaining(self) -> int:
        return max(0, int((self.per_window - self.level) * 60))

    def full_in(self, now: float) -> float:
        """Seconds until the next window (an admitted reply's ``x-ratelimit-reset-*``)."""
        return max(0.001, self.window + 1 - now)


class _Bucket:
    """One per-minute limit as a token bucket of one second's share, refilled continuously (full at the start)."""

    def __init__(self, per_minute: float):
        self.per_minute, self.rate = per_minute, per_minute / 60.0  # the capacity is one second's refill
        self.level, self.at = self.rate, -math.inf

    def _refill(self, now: float) -> None:
        if now > self.at:
            self.level = min(self.rate, self.level + self.rate * (now - self.at))
            self.at = now

    def _needs(self, cost: float) -> float:
        return min(cost, self.rate)  # a request larger than the bucket waits for a full one

    def fits(self, cost: float, now: float) -> bool:
        self._refill(now)
        return self.level >= self._needs(cost) - 1e-9

    def spend(self, cost: float) -> None:
        self.level -= cost

    def reset_s(self, cost: float, now: float) -> float:
        """Seconds until the bucket holds the request's cost."""
        self._refill(now)
        return max(0.001, (self._needs(cost) - self.level) / self.rate)

    def remaining(self) -> int:
        return max(0, int(self.level + 1e-9))

    def full_in(self, now: float) -> float:
        """Seconds until the bucket is full again."""
        self._refill(now)
        return max(0.001, (self.rate - self.level) / self.rate)


_Limit = _Window | _Bucket
BUCKETS = ("windows", "continuous")  #: how a per-minute limit is spent: one-second windows, or a continuous bucket


@dataclass
class Verdict:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]
    kind: str  #: "429" or the refusal's status


class KeyLimits:
    """Admits or refuses each request as a key with these limits would (thread-safe)."""

    def __init__(self, rpm: float = 0.0, tpm: float = 0.0, closed_s: float = 0.0, refuse: str = "",
                 pool: str = "model", headers: str = "openai", bucket: str = "windows"):
        if refuse and refuse not in REFUSALS:
            raise ValueError(f"refuse={refuse!r}: one of {sorted(REFUSALS)}")
        if pool not in ("model", "key") or headers not in ("openai", "retry-after") or bucket not in BUCKETS:
            raise ValueError(f"pool={pool!r}, headers={headers!r}, bucket={bucket!r}: pool is model or key, headers "
                             f"openai or retry-after, bucket one of {BUCKETS}")
        self.rpm, self.tpm, self.pool, self.headers = rpm, tpm, pool, headers
        self._limit = _Bucket if bucket == "continuous" else _Window
        self.windows: dict[str, tuple[_Limit | None, _Limit | None]] = {}
        self.ideal_by_model: dict[str, float] = {}
        self.closed_s, self.refuse = closed_s, refuse
        self.opened_at: float | None = None
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return bool(self.rpm or self.tpm or self.closed_s or self.refuse)

    @property
    def ideal_s(self) -> float:
        return max(self.ideal_by_model.values(), default=0.0)

    def check(self, body: dict[str, Any], now: float | None = None) -> Verdict | None:
        """None: admitted (and counted); else the refusal to send."""
        now = time.time() if now is None else now
        model = str(body.get("model") or "stub")
        if self.refuse:
            status, payload, headers = refusal(self.refuse, model)
            return Verdict(status, payload, headers, self.refuse)
        cost = prompt_tokens(body) + int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)  # TPM's
        with self._lock:
            if self.opened_at is None:
                self.opened_at = now
            if self.closed_s and now - self.opened_at < self.closed_s:
                wait = min(self.closed_s - (now - self.opened_at), 1.0)  # "try again in 1s", as long as it lasts
                return self._limited("requests", model, wait, 0, 0, 1, (None, None), now)
            pool = model if self.pool == "model" else "key"
            windows = self.windows.get(pool)
            if windows is None:
                windows = self.windows[pool] = (self._limit(self.rpm) if self.rpm else None,
                                                self._limit(self.tpm) if self.tpm else None)
            for kind, window, amount in (("requests", windows[0], 1), ("tokens", windows[1], cost)):
                if window is not None and not window.fits(amount, now):
                    return self._limited(kind, model, window.reset_s(amount, now), window.per_minute,
                                         window.per_minute - window.remaining(), amount, windows, now)
            for window, amount in zip(windows, (1, cost), strict=False):
                if window is not None:
                    window.spend(amount)
            self.ideal_by_model[pool] = self.ideal_by_model.get(pool, 0.0) + max(
                60.0 / self.rpm if self.rpm else 0.0, 60.0 * cost / self.tpm if self.tpm else 0.0)
        return None

    def stated(self, body: dict[str, Any], now: float | None = None) -> dict[str, str]:
        """The limit headers of an admitted request's reply (OpenAI sends them with every response; a provider
        that states only ``retry-after`` sends none)."""
        if self.headers != "openai" or not (self.rpm or self.tpm):
            return {}
        now = time.time() if now is None else now
        model = str(body.get("model") or "stub")
        with self._lock:
            windows = self.windows.get(model if self.pool == "model" else "key") or (None, None)
            return _window_headers(windows, lambda name, window: window.full_in(now))

    def _limited(self, kind: str, model: str, wait: float, limit: float, used: float, requested: int,
                 windows: tuple[_Limit | None, _Limit | None], now: float) -> Verdict:
        if self.headers == "retry-after":  # the wait in whole seconds, and nothing else
            body = {"error": {"message": "Too many requests. Please slow down.", "type": "rate_limit_error",
                              "param": None, "code": "rate_limit_exceeded"}}
            return Verdict(429, body, {"retry-after": str(max(1, math.ceil(wait)))}, "429")
        unit = "requests per min (RPM)" if kind == "requests" else "tokens per min (TPM)"
        message = (f"Rate limit reached for {model} in organization org-stub on {unit}: Limit {limit:g}, Used "
                   f"{used:g}, Requested {requested}. Please try again in "
                   f"{openai_duration(wait)}. Visit https://platform.openai.com/account/rate-limits to learn more.")
        # a window's resets: the wait for the refused limit, the other's already open; a bucket's: until it is full
        reset = ((lambda name, window: window.full_in(now)) if self._limit is _Bucket
                 else (lambda name, window: wait if name == kind else 0.001))
        headers = {"retry-after": str(max(1, math.ceil(wait))), "retry-after-ms": str(max(1, round(wait * 1000))),
                   **_window_headers(windows, reset)}
        body = {"error": {"message": message, "type": kind, "param": None, "code": "rate_limit_exceeded"}}
        return Verdict(429, body, headers, "429")


def _window_headers(windows: tuple[_Limit | None, _Limit | None],
                    reset_s: Callable[[str, _Limit], float]) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-limit-*``, ``-remaining-*`` and ``-reset-*`` of the requests and tokens windows."""
    out = {}
    for name, window in zip(("requests", "tokens"), windows, strict=False):
        if window is not None:
            reset = openai_duration(reset_s(name, window))  # first: a bucket refills to the moment it states
            out[f"x-ratelimit-limit-{name}"] = f"{window.per_minute:g}"
            out[f"x-ratelimit-remaining-{name}"] = str(window.remaining())
            out[f"x-ratelimit-reset-{name}"] = reset
    return out
