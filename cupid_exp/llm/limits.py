"""The pieces of a provider pool's limits (``cupid_exp.llm.pools`` holds one set per pool; docs/limits-and-budgets.md).

- ``AdaptiveLimit``: the requests in flight (AIMD), starting at a quarter of the bound (a slow start, so that a key's
  first window does not meet the whole burst), ×0.8 on a 429 at most once per ``COOLDOWN_S``, +10% after a round of
  successes;
- ``Pacer``: no request before the requests and tokens per minute allow, counted as OpenAI counts them, with the
  schedule in a ledger file under ``calls.cache_dir/rate_limits/`` shared by every process on the pool. At the
  moment of sending no second holds more than its share: a caller a busy CPU woke late waits rather than land in
  the next second's window, and none goes within half the spacing of the last (a pair straddles a window's edge);
- ``RefusalPace``: the pace learned from the refusals of a provider that states no limit, probed upward, cut on a
  refusal, and dropped when the refusals do not fall with it (an overloaded provider's).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import math
import time
from collections import deque
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, TypeVar

from cupid_exp.llm.messages import Message

if TYPE_CHECKING:
    from filelock import FileLock

COOLDOWN_S = 3.0  #: at most one cut of the concurrency limit (or of a pace) per this many seconds
DECREASE, INCREASE = 0.8, 0.1  #: the cut on a 429, the share added after a round of successes
WINDOW_S = 1.0  #: the provider's window for requests sent: OpenAI quantises per-minute limits into seconds
PACE_MARGIN = 0.98  #: pace at this share of the stated limits (the provider's windows and ours never align exactly)
SLOW_START = 4  #: the least a limit starts at (a quarter of max_concurrency otherwise)
MIN_GAP = 0.5  #: at the moment of sending, at least this share of the pace's spacing after the last send
CHARS_PER_TOKEN = 4  #: the prompt estimate for tokens-per-minute (OpenAI's own rule of thumb)
_T = TypeVar("_T")


#: the order in which calls waiting for a slot get one: lower first, then first come (``first_in_line``)
_FIRST, _IN_TURN = 0, 1
_PRIORITY: ContextVar[int] = ContextVar("cupid_call_priority", default=_IN_TURN)


@contextmanager
def _priority(priority: int) -> Iterator[None]:
    token = _PRIORITY.set(priority)
    try:
        yield
    finally:
        _PRIORITY.reset(token)


def first_in_line() -> AbstractContextManager[None]:
    """Calls made in this context (and in the tasks it starts) take a free slot before the others waiting: a
    unit's critical path (a persona's sessions, one after another) is not queued behind the work that can wait
    (its dialogues, which fill the slots meanwhile)."""
    return _priority(_FIRST)


def in_turn() -> AbstractContextManager[None]:
    """Calls made in this context wait their turn, even inside ``first_in_line``: for work a critical path starts
    but does not wait for (a persona's checklists, started as each factor is written)."""
    return _priority(_IN_TURN)


def estimated_tokens(messages: list[Message], max_tokens: int | None) -> int:
    """What a request counts toward tokens-per-minute: prompt characters / 4 plus the reply's reserve."""
    chars = sum(len(m.get("content") or "") if isinstance(m.get("content"), str) else len(str(m.get("content")))
                for m in messages)
    return chars // CHARS_PER_TOKEN + int(max_tokens or 0)


class AdaptiveLimit:
    """How many requests may be in flight (AIMD), for any event loop of the process (sweeps run several). Calls
    waiting for a slot get one in the order of their priority (``first_in_line``), then of their arrival."""

    def __init__(self, ceiling: int):
        self.ceiling = max(1, ceiling)
        self.limit = float(min(self.ceiling, max(SLOW_START, self.ceiling // 4)))
        self.slow_start = self.limit < self.ceiling
        self.in_flight = 0
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  #: a heap: (priority, arrival, waiter)
        self._arrivals = itertools.count()
        self._last_cut = -math.inf
        self._ok = 0
        self.cuts = 0

    def set_ceiling(self, ceiling: int) -> None:
        """A new bound (a config joined the pool, or the processes sharing it changed): the limit keeps its
        headroom when the bound grows, and never stays over it when it shrinks."""
        ceiling = max(1, ceiling)
        grow = ceiling - self.ceiling
        if grow:
            self.ceiling = ceiling
            self.limit = max(1.0, min(float(ceiling), self.limit + max(0, grow)))
            self.slow_start = self.slow_start and self.limit < ceiling
            self._wake()

    async def acquire(self) -> None:
        if self.in_flight < int(self.limit) and not self._waiters:
            self.in_flight += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (_PRIORITY.get(), next(self._arrivals), waiter))
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
            waiter = heapq.heappop(self._waiters)[2]
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
        self._lock: FileLock | None = None
        if ledger is not None:
            from filelock import FileLock

            ledger.parent.mkdir(parents=True, exist_ok=True)
            self._lock = FileLock(str(ledger) + ".lock")

    @property
    def active(self) -> bool:
        return bool(self.rpm or self.tpm)

    def reserve(self, tokens: int, now: float | None = None) -> float:
        """Book one request of ``tokens`` at ``now`` (wall clock); the seconds to wait before sending it."""
        return self._update(lambda state: self._book(state, tokens, time.time() if now is None else now))

    def admit(self, now: float | None = None) -> float:
        """At the moment of sending (``now``, wall clock): 0 and the send recorded, or the seconds to wait first
        because the last second already holds the paced share of requests, or the last send was just now
        (wake-ups delayed by a busy CPU arrive together)."""
        if not self.rpm:
            return 0.0
        rpm, at = self.rpm, time.time() if now is None else now
        return self._update(lambda state: self._admit(state, at, rpm))

    def _admit(self, state: dict[str, Any], now: float, rpm: float) -> float:
        # the second's share rounded up: rounded down, 300 RPM (4.9 a second at the margin) sent 4, a fifth too few;
        # the schedule (``reserve``) keeps the average, this only stops late wake-ups from bunching
        per_second: float = rpm * PACE_MARGIN * state.get("scale", 1.0) / 60.0
        cap = max(1, math.ceil(per_second * WINDOW_S - 1e-9))
        sent: list[float] = sorted(t for t in state.get("sent", ()) if t > now - WINDOW_S)
        if len(sent) >= cap:
            return max(0.001, sent[-cap] + WINDOW_S - now)
        # nor closer to the last send than half the pace's spacing: two wake-ups that came due together, sent
        # together, reached a provider whose window had turned between them (its clock is not ours)
        if sent and now - sent[-1] < MIN_GAP / per_second - 1e-6:
            return max(0.001, sent[-1] + MIN_GAP / per_second - now)
        state["sent"] = [*sent, now]
        return 0.0

    def seed(self, sent: Iterable[float]) -> None:
        """Sends made before pacing began (wall-clock times): the send-time check counts the last second's, so that
        the first paced requests do not land in a window the unpaced ones filled."""
        def add(state: dict[str, Any]) -> None:
            now = time.time()
            state["sent"] = sorted({*state.get("sent", ()), *(t for t in sent if t > now - WINDOW_S)})
        self._update(add)

    def rate_limited(self) -> None:
        """A 429 while pacing: ×0.9 at most once per cooldown, for every process of the ledger."""
        self._update(lambda state: state.update(scale=max(0.5, state.get("scale", 1.0) * 0.9), cut=time.time())
                     if time.time() - state.get("cut", 0.0) >= COOLDOWN_S else None)

    def succeeded(self) -> None:
        self._update(lambda state: state.update(scale=min(1.0, state.get("scale", 1.0) + 0.002)))

    def _update(self, change: Callable[[dict[str, Any]], _T]) -> _T:
        """``change`` on the schedule: in memory, or the ledger's under its lock (written back when changed)."""
        if self._lock is None or self.ledger is None:  # set together
            state = self._state
            result = change(state)
        else:
            with self._lock:
                try:
                    state = json.loads(self.ledger.read_text())
                except (OSError, ValueError):
                    state = {"requests": 0.0, "tokens": 0.0}
                before = json.dumps(state)
                result = change(state)
                if json.dumps(state) != before:
                    self.ledger.write_text(json.dumps(state))
        self.scale = state.get("scale", 1.0)
        return result

    def _book(self, state: dict[str, float], tokens: int, now: float) -> float:
        start = max(now, state.get("requests", 0.0) if self.rpm else now, state.get("tokens", 0.0) if self.tpm else now)
        share = PACE_MARGIN * state.get("scale", 1.0)
        if self.rpm:
            state["requests"] = start + 60.0 / (self.rpm * share)
        if self.tpm:
            state["tokens"] = start + 60.0 * tokens / (self.tpm * share)
        return start - now


PROBE_S = 1.0  #: a learned pace grows at most once per this many seconds (and only while it binds)
PROBE_STEPS = (1.15, 1.05)  #: ... by this factor before any refusal while paced, and after one
PROBE_CEILING = 0.97  #: ... up to this share of the lowest pace a refusal came at
FIRST_HEADROOM = 1.05  #: the first lesson's probes stay under this much more than was admitted (a window
#: admits about its limit, so probing far past it only buys refusals)
FORGET_REFUSED_S = 60.0  #: after this long with no refusal, the pace may probe past the one refused before
MEASURE_S = 3.0  #: a refusal measures what was admitted over the last this many seconds
HORIZON_S = 10.0  #: the sends and refusals kept
MIN_ADMITTED = 3  #: fewer admitted requests than this tell nothing about the pace (a window closed from the start)
JUDGE_SENT, JUDGE_REFUSED = 60, 3  #: a cut is judged after a cooldown and this many requests sent at its pace,
#: or refused (the pace held meanwhile); fewer refusals than this at it: the cut answered them
OVERLOAD_NEWS = (1.5, 0.05)  #: once overloaded, refusals are news of a limit above this share: overload x a + b
BOUND = 0.8  #: a refusal while the last seconds sent under this share of the pace is not the pace's: no cut
#: a first lesson needs refusals that come together: at least this many, and this share of what was sent, over the
#: last ``LESSON_S`` (a limit refuses every request once its window is spent; an overload refuses a few at random,
#: though by chance 10% once refused 5 of a job's first 18); over fewer than ``LESSON_SENT`` sent, a share of that many
LESSON_REFUSED, LESSON_SHARE, LESSON_S, LESSON_SENT = 3, 0.25, 1.0, 20
OVERLOAD_MOST = 0.25  #: a cut is judged an overload's only where the share refused is under this (thicker: a limit)


class RefusalPace:
    """Requests per minute a provider admits where it states no limit: headers alone left such a pool unpaced (the AIMD
    limit and the pauses bound what is in flight, not how fast it goes out). An overloaded provider refuses a share
    of requests at any pace, so each cut is judged (``_settle``) by the share refused at its pace against the share
    refused just before it."""

    def __init__(self) -> None:
        self.sends: deque[float] = deque()  #: wall-clock times of the requests sent, the last ``HORIZON_S``
        self.refusals: deque[float] = deque()
        self.rpm: float | None = None  #: None until a refusal taught a pace
        self.refused_rpm = math.inf  #: the lowest pace a refusal came at (the pace probes stay under)
        self.changed_at = self.cut_at = -math.inf  #: the pace's last change (a probe or a cut), its last cut
        self.learned_at = -math.inf  #: when the first refusal taught the pace
        self.last_refusal = -math.inf
        self.n_sent = self.n_refused = 0  #: counted since the start
        #: the last cut, not judged yet: ``n_sent`` and ``n_refused`` at it, the requests a second sent and the
        #: share refused over the ``MEASURE_S`` before it
        self._cut: tuple[int, int, float, float] | None = None
        self.overload: float | None = None  #: the share refused whatever the pace, once a cut showed it
        self.news = True  #: the last refusal taught or cut the pace, or came before any was taught

    def sent(self, now: float) -> None:
        self.sends.append(now)
        self.n_sent += 1
        if len(self.sends) > 4096:
            self._prune(now)

    def _prune(self, now: float) -> None:
        for times in (self.sends, self.refusals):
            while times and times[0] < now - HORIZON_S:
                times.popleft()

    def _share(self, now: float, seconds: float) -> tuple[int, int, float]:
        """Requests sent and refused over the last ``seconds`` (or since the first send), and the seconds."""
        since = max(now - seconds, self.sends[0] if self.sends else now)
        return (sum(1 for t in self.sends if t >= since), sum(1 for t in self.refusals if t >= since),
                max(WINDOW_S, now - since))

    def refused(self, now: float, hint: float | None) -> bool:
        """A 429: refusals that come together (``LESSON_SHARE`` of what was sent over ``LESSON_S``: a limit's) teach
        the pace (what was admitted lately) and cap the probes a little above it; the rest of that burst correct it.
        A refusal alone among answers before any lesson teaches nothing (the first still pauses the pool). Later
        ones cap the probes under the pace they came at and cut it (×0.9, or to what was admitted if less): once
        per cooldown, unless a probe raised the pace since the cut (a refusal just after a cut may answer a request
        the earlier pace sent), not while well under the pace, and not before the last cut is judged. Once refusals
        proved an overload, only a share clearly above it cuts. True when the pace changed; ``news``: the refusal
        taught or cut it (the others are retried after the wait they asked and change nothing else)."""
        self.refusals.append(now)
        self.n_refused += 1
        self._prune(now)
        self.last_refusal = now
        changed = self._settle(now)
        # requests per minute the provider admitted lately (sent and not refused, over the last ``MEASURE_S``): what
        # it allows, since a refusal says the pool was asking for more. None: too few to tell
        sent, refused, seconds = self._share(now, MEASURE_S)
        measured = 60.0 * (sent - refused) / seconds if sent - refused >= MIN_ADMITTED else None
        self.news = self.rpm is None
        if self.overload is not None and self._cut is None:
            sent, refused, seconds = self._share(now, HORIZON_S)
            if refused < JUDGE_REFUSED or refused <= sent * (OVERLOAD_NEWS[0] * self.overload + OVERLOAD_NEWS[1]):
                self.news = False  # the overload's share: retried after the wait asked, nothing cut
                return changed
            if self.rpm is None:
                self.learned_at = -math.inf  # a limit besides the overload: taught afresh
        if self.rpm is None and self.overload is None:
            sent, refused, _ = self._share(now, LESSON_S)
            if refused < LESSON_REFUSED or refused < LESSON_SHARE * max(sent, LESSON_SENT):
                # refusals alone among answers (an overload's): their calls wait, nothing is learned; the first one
                # still pauses the pool (news), so that a limit's burst is not met by a second burst
                self.news = self.n_refused == 1
                return changed
        if self.rpm is None or now - self.learned_at < PROBE_S:
            if measured is None:
                return changed
            self.news = True
            if self.rpm is None:
                self.learned_at = self.cut_at = self.changed_at = now
            self.rpm = measured if self.rpm is None else min(self.rpm, measured)
            self.refused_rpm = FIRST_HEADROOM * self.rpm
            return True
        if self._cut is not None:
            return changed  # the last cut's effect not judged yet: the pace held
        if self.overload is None:
            if now - self.cut_at < COOLDOWN_S and self.changed_at <= self.cut_at:
                return changed
            if 60.0 * sent / seconds < BOUND * self.rpm:  # over the last ``MEASURE_S``, as counted above
                return changed  # sent well under the pace: a refusal the pace did not cause
        self._cut = (self.n_sent, self.n_refused, sent / seconds, refused / max(1, sent))
        self.refused_rpm = min(self.refused_rpm, self.rpm)
        self.rpm = 0.9 * self.rpm if measured is None else min(0.9 * self.rpm, max(measured, 0.5 * self.rpm))
        self.cut_at = self.changed_at = now
        self.news = True
        return True

    def _settle(self, now: float) -> bool:
        """Judge the last cut once its pace has been seen (a cooldown, then ``JUDGE_SENT`` requests or
        ``JUDGE_REFUSED`` refusals): a limit that refused a share ``s`` of requests sent at ``r`` a second refuses
        ``1 - (1 - s) r / r'`` of those sent at ``r' < r`` (none where that is below 0), an overload the same ``s``.
        Where the share fell by less than half of what a limit's would have, the refusals are the provider's
        overload, whatever the pace: the pace they taught is dropped (the pool goes unpaced, as before any
        refusal). A cut that did not slow the sends (the pace did not bind) tells nothing: it stands. True when
        the pace changed."""
        if self._cut is None or now - self.cut_at < COOLDOWN_S:
            return False
        n_sent, n_refused, rate, before = self._cut
        sent, refused = self.n_sent - n_sent, self.n_refused - n_refused
        if sent < JUDGE_SENT and refused < JUDGE_REFUSED:
            return False
        self._cut, after, slower = None, refused / max(1, sent), rate * (now - self.cut_at) / max(1, sent)
        expected = min(before, (1.0 - before) * (slower - 1.0))
        if refused < JUDGE_REFUSED or slower < 1.05 or before - after >= 0.5 * expected:
            return False  # the refusals answered the cut, or the cut did not slow the sends: it stands
        if max(before, after) >= OVERLOAD_MOST:
            return False  # refusals that come this thick are a limit's (its windows make the share noisy): it stands
        self.overload = max(before, after)
        self.rpm, self.refused_rpm, self.changed_at = None, math.inf, now
        return True

    def binding(self, now: float) -> bool:
        """The pace held a request back: probe faster, unless it is just under a refused pace or a cut is being
        judged. True when the pace changed."""
        if self._settle(now):
            return True
        if self.rpm is None or self._cut is not None or now - self.changed_at < PROBE_S:
            return False
        if now - self.last_refusal > FORGET_REFUSED_S:
            self.refused_rpm = math.inf
        target = self.refused_rpm * PROBE_CEILING
        if self.rpm >= target:
            return False
        self.rpm = min(target, self.rpm * PROBE_STEPS[self.refused_rpm < math.inf])
        self.changed_at = now
        return True

    def adopt(self, rpm: float, refused_rpm: float, now: float) -> None:
        """Another process's lesson (``cupid_exp.llm.pools``): one pace for the whole pool."""
        self.rpm, self.refused_rpm, self.changed_at = rpm, refused_rpm, now

