"""A provider endpoint's limits as this process sees them, shared by every client that calls it.

An endpoint is a model at an API base with one key (the key enters only a hash). Every client of the
process that calls the same endpoint shares its ``Endpoint``:

- an adaptive concurrency limit (AIMD): it starts at a quarter of the clients' ``max_concurrency`` (summed
  over distinct model configs on the endpoint; at least 4) and grows by one per success up to it (slow start,
  so that a key's first window does not meet the whole burst), falls ×0.8 on a 429 (at most once per
  ``COOLDOWN_S``, which ends the slow start), and climbs back by 10% after a round of successes (as many as
  the limit) with no 429, never under 1 nor over ``max_concurrency``;
- a pause: a 429 that says how long to wait holds every caller of the endpoint until then, not only the
  one that got it (the others would meet the same closed window);
- a pacer (``rpm``/``tpm`` on the model config, else the limits the provider states in its
  ``x-ratelimit-limit-*`` headers once it refused a request): each request is sent no earlier than the
  requests and tokens before it allow, counted as OpenAI counts them (prompt estimate + ``max_tokens``); a 429
  while pacing slows the pace ×0.9 (once per cooldown, down to half), success brings it back slowly: the
  provider's windows and our clock never align exactly. At the moment of sending, no second may hold more
  than the paced share of requests (rounded up): a caller that woke late (a busy CPU) waits instead of landing on top of
  the next second's requests, where the provider's one-second window would refuse the excess.
  Its schedule is a small ledger file under ``runtime.cache_dir/rate_limits/`` (``filelock``), so worker
  processes and the jobs of a parallel sweep on the same key stay within the limits together;
- whether it refused for good (a bad key, an unknown model, no connection ever): later calls are not sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

from cupid_exp.llm.retry import FatalProviderError

COOLDOWN_S = 3.0  #: at most one cut of the concurrency limit per this many seconds
DECREASE, INCREASE = 0.8, 0.1  #: the cut on a 429, the share added after a round of successes
WINDOW_S = 1.0  #: the provider's window for requests sent: OpenAI quantises per-minute limits into seconds
PACE_MARGIN = 0.98  #: pace at this share of the stated limits (the provider's windows and ours never align exactly)
SLOW_START = 4  #: the least a limit starts at (a quarter of max_concurrency otherwise)
CHARS_PER_TOKEN = 4  #: the prompt estimate for tokens-per-minute (OpenAI's own rule of thumb)


def estimated_tokens(messages: list[dict], max_tokens: int | None) -> int:
    """What a request counts toward tokens-per-minute: prompt characters / 4 plus the reply's reserve."""
    chars = sum(len(m.get("content") or "") if isinstance(m.get("content"), str) else len(str(m.get("content")))
                for m in messages)
    return chars // CHARS_PER_TOKEN + int(max_tokens or 0)


class AdaptiveLimit:
    """How many requests may be in flight (AIMD), for any event loop of the process (sweeps run several)."""

    def __init__(self, ceiling: int):
        self.ceiling = max(1, ceiling)
        self.limit = float(min(self.ceiling, max(SLOW_START, self.ceiling // 4)))
        self.slow_start = self.limit < self.ceiling
        self.in_flight = 0
        self._waiters: deque[asyncio.Future] = deque()
        self._last_cut = -math.inf
        self._ok = 0
        self.cuts = 0

    def raise_ceiling(self, ceiling: int) -> None:
        grow = max(1, ceiling) - self.ceiling
        if grow > 0:
            self.ceiling += grow
            self.limit = min(float(self.ceiling), self.limit + grow)
            self._wake()

    async def acquire(self) -> None:
        if self.in_flight < int(self.limit) and not self._waiters:
            self.in_flight += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot came with the cancellation: hand it on
            raise

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < int(self.limit):
            waiter = self._waiters.popleft()
            if waiter.done() or waiter.get_loop().is_closed():
                continue
            self.in_flight += 1
            waiter.set_result(None)

    def rate_limited(self, now: float) -> None:
        self.slow_start = False
        if now - self._last_cut >= COOLDOWN_S:
            self.limit = max(1.0, self.limit * DECREASE)
            self._last_cut, self._ok = now, 0
            self.cuts += 1

    def succeeded(self, now: float) -> None:
        if self.slow_start:
            self.limit = min(float(self.ceiling), self.limit + 1)
            self.slow_start = self.limit < self.ceiling
            self._wake()
            return
        self._ok += 1
        if self.limit < self.ceiling and self._ok >= int(self.limit) and now - self._last_cut >= COOLDOWN_S:
            self.limit = min(float(self.ceiling), self.limit + max(1.0, self.limit * INCREASE))
            self._ok = 0
            self._wake()


class Pacer:
    """Sends no request before the requests and tokens per minute allow (virtual scheduling, no burst): each
    reservation books the next free moment in a schedule kept in memory or in a ledger file shared by every
    process that paces the same endpoint."""

    def __init__(self, rpm: float | None, tpm: float | None, ledger: Path | None):
        self.rpm, self.tpm, self.ledger = rpm, tpm, ledger
        self.scale = 1.0  # of the stated limits: lowered by 429s met while pacing (kept in the ledger)
        self._state: dict[str, Any] = {"requests": 0.0, "tokens": 0.0}  # wall-clock times the next request / token
        # is free; "sent": when the requests of the last second went out
        self._lock: Any = None
        if ledger is not None:
            from filelock import FileLock

            ledger.parent.mkdir(parents=True, exist_ok=True)
            self._lock = FileLock(str(ledger) + ".lock")

    @property
    def active(self) -> bool:
        return bool(self.rpm or self.tpm)

    def reserve(self, tokens: int) -> float:
        """Book one request of ``tokens``; the seconds to wait before sending it."""
        if self._lock is None:
            return self._book(self._state, tokens)
        with self._lock:
            state = self._read()
            wait = self._book(state, tokens)
            self.ledger.write_text(json.dumps(state))
        return wait

    def admit(self) -> float:
        """At the moment of sending: 0 and the send recorded, or the seconds to wait first because the last
        second already holds the paced share of requests (wake-ups delayed by a busy CPU arrive together)."""
        if not self.rpm:
            return 0.0
        if self._lock is None:
            return self._admit(self._state)
        with self._lock:
            state = self._read()
            wait = self._admit(state)
            if wait == 0.0:
                self.ledger.write_text(json.dumps(state))
        return wait

    def _admit(self, state: dict[str, Any]) -> float:
        now = time.time()
        # the second's share rounded up: rounded down, 300 RPM (4.9 a second at the margin) sent 4, a fifth too few;
        # the schedule (``reserve``) keeps the average, this only stops late wake-ups from bunching
        cap = max(1, math.ceil(self.rpm * PACE_MARGIN * state.get("scale", 1.0) * WINDOW_S / 60.0 - 1e-9))
        sent = sorted(t for t in state.get("sent", ()) if t > now - WINDOW_S)
        if len(sent) >= cap:
            return max(0.001, sent[-cap] + WINDOW_S - now)
        state["sent"] = [*sent, now]
        return 0.0

    def rate_limited(self) -> None:
        """A 429 while pacing: ×0.9 at most once per cooldown, for every process of the ledger."""
        self._update(lambda state: state.update(scale=max(0.5, state.get("scale", 1.0) * 0.9), cut=time.time())
                     if time.time() - state.get("cut", 0.0) >= COOLDOWN_S else None)

    def succeeded(self) -> None:
        self._update(lambda state: state.update(scale=min(1.0, state.get("scale", 1.0) + 0.002)))

    def _update(self, change: Any) -> None:
        if self._lock is None:
            change(self._state)
            self.scale = self._state.get("scale", 1.0)
            return
        with self._lock:
            state = self._read()
            change(state)
            self.scale = state.get("scale", 1.0)
            self.ledger.write_text(json.dumps(state))

    def _read(self) -> dict[str, Any]:
        try:
            return json.loads(self.ledger.read_text())
        except (OSError, ValueError):
            return {"requests": 0.0, "tokens": 0.0}

    def _book(self, state: dict[str, float], tokens: int) -> float:
        now = time.time()
        start = max(now, state.get("requests", 0.0) if self.rpm else now, state.get("tokens", 0.0) if self.tpm else now)
        self.scale = state.get("scale", 1.0)
        share = PACE_MARGIN * self.scale
        if self.rpm:
            state["requests"] = start + 60.0 / (self.rpm * share)
        if self.tpm:
            state["tokens"] = start + 60.0 * tokens / (self.tpm * share)
        return start - now


@dataclass
class Held:
    seconds: float  #: how long the request waited for the pause and the pacer


class Endpoint:
    """One model at one API base with one key: its concurrency limit, pause, pacer and fatal refusal."""

    def __init__(self, ident: str, label: str, ceiling: int, rpm: float | None, tpm: float | None,
                 ledger_dir: Path | None):
        self.ident, self.label = ident, label
        self.concurrency = AdaptiveLimit(ceiling)
        self.configured = (rpm, tpm)
        self.ledger_dir = ledger_dir
        self.pacer = Pacer(rpm, tpm, self._ledger(rpm, tpm))
        self.paused_until = 0.0  # monotonic
        self.fatal: FatalProviderError | None = None
        self.successes = 0
        self.refused = 0
        self.wait_s = 0.0  #: time callers spent held by the pause or the pacer

    def _ledger(self, rpm: float | None, tpm: float | None) -> Path | None:
        if self.ledger_dir is None or not (rpm or tpm):
            return None
        return self.ledger_dir / f"{self.ident}.json"

    def learn(self, told: tuple[float | None, float | None]) -> None:
        """Pace at the limits the provider stated, where the config named none."""
        rpm = self.configured[0] or told[0]
        tpm = self.configured[1] or told[1]
        if (rpm, tpm) != (self.pacer.rpm, self.pacer.tpm):
            self.pacer = Pacer(rpm, tpm, self._ledger(rpm, tpm))
        elif self.pacer.active:
            self.pacer.rate_limited()

    def pause(self, seconds: float) -> None:
        self.paused_until = max(self.paused_until, time.monotonic() + seconds)

    @asynccontextmanager
    async def slot(self, tokens: int) -> AsyncIterator[Held]:
        """Held while one request is in flight: after the pause, within the concurrency limit, at the pace."""
        waited = 0.0
        await self.concurrency.acquire()
        try:
            while (hold := self.paused_until - time.monotonic()) > 0:
                waited += hold
                await asyncio.sleep(hold)
            if self.pacer.active:
                delay = self.pacer.reserve(tokens)
                while delay > 0 or (delay := self.pacer.admit()) > 0:
                    waited += delay
                    await asyncio.sleep(delay)
                    delay = 0.0
            self.wait_s += waited
            yield Held(waited)
        finally:
            self.concurrency.release()


_ENDPOINTS: dict[str, Endpoint] = {}
_CEILINGS: dict[str, dict[str, int]] = {}


def endpoint_for(litellm_model: str, api_base: str | None, api_key: str | None, *, label: str, config_id: str,
                 max_concurrency: int, rpm: float | None, tpm: float | None, ledger_dir: Path | None) -> Endpoint:
    """The process's Endpoint for this model, base and key (made on first use). Its concurrency ceiling is the
    sum of the distinct model configs' ``max_concurrency`` on it, so that each keeps the bound it had alone."""
    ident = hashlib.sha256(json.dumps([litellm_model, api_base or "", api_key or ""]).encode()).hexdigest()[:16]
    ceilings = _CEILINGS.setdefault(ident, {})
    ceilings[config_id] = max(1, max_concurrency)
    if ident not in _ENDPOINTS:
        _ENDPOINTS[ident] = Endpoint(ident, label, sum(ceilings.values()), rpm, tpm, ledger_dir)
    else:
        _ENDPOINTS[ident].concurrency.raise_ceiling(sum(ceilings.values()))
    return _ENDPOINTS[ident]


def limit_metrics() -> dict[str, float]:
    """Progress metrics: each endpoint's current concurrency limit and its pacer's requests per minute."""
    out: dict[str, float] = {}
    for ep in list(_ENDPOINTS.values()):
        out[f"progress/limits/{ep.label}/concurrency"] = float(int(ep.concurrency.limit))
        if ep.pacer.rpm:
            out[f"progress/limits/{ep.label}/rpm"] = float(ep.pacer.rpm)
    return out


def forget_endpoints() -> None:
    """Tests: start the next client from a fresh state."""
    _ENDPOINTS.clear()
    _CEILINGS.clear()
