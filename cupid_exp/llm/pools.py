"""A provider's pool: what its limits apply to, shared by every role, snapshot, process and job that calls it.

Providers limit a key per pool (a model family, a rate-limit group, a proxy's capacity), not per model config:
which pool a config calls (``pool_name``) and what a pool holds are in docs/limits-and-budgets.md. Processes on one
pool share the pace through the pacer's ledger and the rest through ``calls.cache_dir/rate_limits/<pool>.pool.json``
(``pool_state``), exchanged at most every ``SYNC_S`` and at each 429.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Mapping
from urllib.parse import urlsplit

from cupid_exp.llm.billing import Reply
from cupid_exp.llm.limits import WINDOW_S, AdaptiveLimit, Pacer, RefusalPace
from cupid_exp.llm.pool_state import SharedPoolState
from cupid_exp.llm.retry import FatalProviderError, JobStop, told_limits

if TYPE_CHECKING:
    from cupid_exp.llm.usage import UsageMeter

log = logging.getLogger(__name__)

PROBE_BASE_S, PROBE_CAP_S = 0.5, 30.0  #: an outage's probes: after 0.5, 1, 2 ... s, then every 30 s
SYNC_S = 0.5  #: how often a pool exchanges its news with the other processes' (and counts into the job's meter)
HEAR_FIRST = 50  #: the replies whose headers may state the limits (a provider that sent none by then sends none)

_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{4})$")  # OpenAI's dated snapshots: -2024-08-06, -0613
_DATED = re.compile(r"-(\d{8}|latest)$")  # Anthropic's: -20250219, -latest
_CLAUDE_4 = re.compile(r"^(claude-(?:opus|sonnet|haiku)-4)-\d+$")  # claude-sonnet-4-5: the Sonnet 4.x group
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def _safe(text: str) -> str:
    """A name that MLflow metric keys and Hydra override keys take (``+calls.pools.<name>.rpm=…``; the
    callers' prefixes make it start with a letter, as Hydra's keys must)."""
    return _UNSAFE.sub("_", text.replace(":", "-").replace("/", "-")).strip("_-") or "pool"


def _at(api_base: str | None, host: str) -> bool:
    return not api_base or urlsplit(api_base).hostname == host


def pool_name(litellm_model: str, api_base: str | None, named: str | None = None) -> str:
    """The pool a model config calls: ``named`` (its ``pool`` key), else the provider's grouping (module doc)."""
    if named:
        return named
    provider, _, model = litellm_model.partition("/")
    if provider == "openai" and _at(api_base, "api.openai.com"):
        return "openai-" + _safe(_SNAPSHOT.sub("", model))
    if provider == "anthropic" and _at(api_base, "api.anthropic.com"):
        model = _DATED.sub("", model)
        return "anthropic-" + _safe(_CLAUDE_4.sub(r"\1", model))
    if api_base:
        parts = urlsplit(api_base)
        return "api-" + _safe(f"{parts.netloc}{parts.path}" if parts.netloc else api_base)
    return _safe(f"{provider}-{model}")


@dataclass(frozen=True)
class PoolLimits:
    """What ``calls.pools.<name>`` gives, once for every config on the pool."""

    rpm: float | None = None
    tpm: float | None = None
    max_concurrency: int | None = None


@dataclass
class Held:
    seconds: float  #: how long the request waited for the pause and the pacer
    probe: bool = False  #: sent to learn whether an endpoint that stopped answering is back


@dataclass
class Members:
    """The model configs on a pool in this process, and the bound they give."""

    given: PoolLimits = field(default_factory=PoolLimits)  #: the job's ``calls.pools.<name>``
    #: each config's max_concurrency in this process, rpm and tpm
    configs: dict[str, tuple[int, float | None, float | None]] = field(default_factory=dict)
    share: float = 1.0  #: this process's part of a given bound (the live processes split it)


@dataclass
class Pace:
    """How fast a pool sends: the limits configured, stated (x-ratelimit-limit-* headers) or learned from refusals,
    the pacer that keeps to them, and the pause the provider asked for."""

    configured: tuple[float | None, float | None] = (None, None)
    told: tuple[float | None, float | None] = (None, None)
    learner: RefusalPace = field(default_factory=RefusalPace)
    pacer: Pacer = field(default_factory=lambda: Pacer(None, None, None))
    paused_until: float = 0.0  #: wall clock: other processes hold to it too

    @property
    def learning(self) -> bool:
        """No limit is configured or stated: only refusals can teach the pace."""
        return not any(self.configured) and not any(self.told)


@dataclass
class Counts:
    """A pool's counts: in all (``Pool.total``), and since the last flush into the job's meter (``Pool.unflushed``:
    its ``wait_s`` adds the waits 429s asked of their own calls)."""

    successes: int = 0
    refused: int = 0  #: connections refused (``retry.REFUSED_BEFORE_FATAL``)
    answered_429: int = 0
    wait_s: float = 0.0  #: time callers spent held by the pause or the pacer
    outages: int = 0


@dataclass
class Outage:
    """Whether the endpoint answers, and an outage's probes."""

    down_since: float | None = None  #: wall clock: the first failure of an outage (None: answering)
    answered_at: float = 0.0  #: wall clock: the endpoint's last reply to this process or another on the pool
    probe_at: float = 0.0  #: wall clock: when the next probe may go
    probing: bool = False  #: a probe is in flight
    probes: int = 0  #: failed probes of this outage
    #: calls that met an outage's failure since the last answer, each with when it first did
    failing: dict[int, float] = field(default_factory=dict)


class Pool:
    """One provider pool, for every client of the process that calls it (``pool_for``)."""

    def __init__(self, ident: str, label: str, ledger_dir: Path | None):
        self.ident, self.label, self.ledger_dir = ident, label, ledger_dir
        self.members, self.pace, self.outage = Members(), Pace(), Outage()
        self.total, self.unflushed = Counts(), Counts()
        self._concurrency: AdaptiveLimit | None = None  # made by the first config that joins
        self.fatal: FatalProviderError | None = None
        self.shared = SharedPoolState(ledger_dir / f"{ident}.pool.json") if ledger_dir is not None else None
        self.meter: UsageMeter | None = None  #: the job's usage meter (its latest client's): per-pool counts go there
        self.sent = self.peak = 0  #: requests sent and the most in flight at once, since the meter was set
        self._sync_due = 0.0

    # ------------------------------------------------------------ membership

    @property
    def concurrency(self) -> AdaptiveLimit:
        """The concurrency limit; a pool is only used once a config joined it."""
        if self._concurrency is None:
            raise RuntimeError(f"pool {self.label!r} used before any model config joined it")
        return self._concurrency

    def join(self, config_id: str, max_concurrency: int, rpm: float | None, tpm: float | None,
             given: PoolLimits, meter: UsageMeter | None) -> None:
        """A client of a model config on this pool: its bound and limits count, ``given`` (the job's
        ``calls.pools.<name>``) wins over the configs'. A new job (a sweep's next, in this process: another
        meter) starts from its own configs; what the pool learned (its limit, pace, pauses) carries over."""
        m = self.members
        if meter is not None and meter is not self.meter:
            m.configs.clear()
        m.configs[config_id] = (max(1, max_concurrency), rpm, tpm)
        m.given = given
        self.pace.configured = (given.rpm or min((r for _, r, _ in m.configs.values() if r), default=None),
                                given.tpm or min((t for _, _, t in m.configs.values() if t), default=None))
        self._repace()
        if self._concurrency is None:
            self._concurrency = AdaptiveLimit(self.bound)
        else:
            self._concurrency.set_ceiling(self.bound)
        if meter is not None and meter is not self.meter:
            self.flush()
            self.meter, self.sent, self.peak = meter, 0, 0
            self.outage.failing.clear()  # an earlier job's failed calls are no evidence of an outage now

    @property
    def bound(self) -> int:
        """Requests in flight this process may have: its share of a given bound, else its configs' largest."""
        m = self.members
        return max(1, int(m.given.max_concurrency * m.share)) if m.given.max_concurrency else max(
            (b for b, _, _ in m.configs.values()), default=1)

    def _repace(self) -> None:
        """The pacer at the configured limits, else the stated ones, else the learned pace (one ledger file)."""
        pace = self.pace
        rpm = pace.configured[0] or pace.told[0] or (pace.learner.rpm if pace.learning else None)
        tpm = pace.configured[1] or pace.told[1]
        if (rpm, tpm) == (pace.pacer.rpm, pace.pacer.tpm):
            return
        if pace.pacer.active and bool(rpm) == bool(pace.pacer.rpm) and bool(tpm) == bool(pace.pacer.tpm):
            pace.pacer.rpm, pace.pacer.tpm = rpm, tpm  # the same ledger: keep its lock and schedule
            return
        ledger = self.ledger_dir / f"{self.ident}.json" if self.ledger_dir is not None and (rpm or tpm) else None
        was_active, pace.pacer = pace.pacer.active, Pacer(rpm, tpm, ledger)
        if not was_active and pace.pacer.rpm:
            pace.pacer.seed(pace.learner.sends)

    # ------------------------------------------------------------ one request

    @asynccontextmanager
    async def slot(self, tokens: int, stop: JobStop) -> AsyncIterator[Held]:
        """Held while one request is in flight: after the pause, within the concurrency limit, at the pace.
        ``stop``: the job's (``retry.JobStop``), which ends a wait for an outage to pass."""
        if time.monotonic() >= self._sync_due:
            self.sync()
        waited, probe, pace, out = 0.0, False, self.pace, self.outage
        limit = self.concurrency
        await limit.acquire()
        try:
            if self.fatal is not None:
                raise self.fatal  # found refusing while this call waited for its slot: not sent
            while out.down_since is not None:  # an outage: one probe at a time, the others wait for its answer
                if self.fatal is not None or stop.fatal is not None:
                    raise self.fatal or stop.fatal  # the outage outlasted the patience, or the job stops
                if not out.probing and time.time() >= out.probe_at:
                    out.probing = probe = True
                    break
                await asyncio.sleep(0.1 if out.probing else min(0.5, max(0.01, out.probe_at - time.time())))
            self.peak = max(self.peak, limit.in_flight)
            while (hold := pace.paused_until - time.time()) > 0:
                waited += hold
                await asyncio.sleep(hold)
            if pace.pacer.active:
                delay = pace.pacer.reserve(tokens)
                if delay > 0 and pace.learning and pace.learner.binding(time.time()):
                    self._learned()
                while delay > 0 or (delay := pace.pacer.admit()) > 0:
                    waited += delay
                    await asyncio.sleep(delay)
                    delay = 0.0
            if pace.learning:
                pace.learner.sent(time.time())
            self.sent += 1
            self.total.wait_s += waited
            self.unflushed.wait_s += waited
            yield Held(waited, probe)
        finally:
            if probe:
                out.probing = False
            limit.release()

    def rate_limited(self, told: tuple[float | None, float | None], hint: float | None, wait: float) -> None:
        """A 429 (``wait``: how long its call now waits): the concurrency cut, the pace learned (the stated
        limits, else from the refusals) or slowed, every caller paused where the provider said how long; where
        the pace is learned, only for a refusal that taught or cut it (``RefusalPace.news``): the others (an
        overloaded provider's, those a cut is being judged by) only make their own call wait."""
        pace = self.pace
        self.total.answered_429 += 1
        self.unflushed.answered_429 += 1
        self.unflushed.wait_s += wait
        learned_pace = pace.learning and pace.learner.rpm is not None
        news = True
        if any(told) and told != pace.told and not all(pace.configured):
            self._stated((told[0] or pace.told[0], told[1] or pace.told[1]))
        elif pace.learning:
            if pace.learner.refused(time.time(), hint):
                self._learned()
            news = pace.learner.news
        elif pace.pacer.active:
            pace.pacer.rate_limited()
        if news:
            cuts = self.concurrency.cuts
            self.concurrency.rate_limited(time.monotonic())
            if self.shared is not None and self.concurrency.cuts > cuts:
                self.shared.cut = True
            # not while a learned pace holds and the wait is a window or less: a provider sending only whole-second
            # ``retry-after`` would idle the pool a second per refusal
            if hint is not None and not (learned_pace and hint <= WINDOW_S):
                self.pause(hint)
        self.sync(news=True)

    def succeeded(self, response: object = None) -> None:
        """A reply: the concurrency limit grows; the limits the reply's headers state (OpenAI sends them with every
        response) pace the pool before any 429, where no limit is known yet."""
        pace = self.pace
        self.total.successes += 1
        self.outage.answered_at = time.time()
        if self.total.successes == 1 and self.shared is not None:
            self.sync()  # the others learn at once that the endpoint answers (``has_answered``)
        self.answers()
        self.concurrency.succeeded(time.monotonic())
        if pace.pacer.scale < 1.0:
            pace.pacer.succeeded()
        if (response is not None and self.total.successes <= HEAR_FIRST and not any(pace.told)
                and not all(pace.configured)):
            # the headers as litellm keeps them (OpenAI's by name, other providers' prefixed); a billed ``Reply``
            # (``cupid_exp.llm.billing``) is read through to its response
            reply = response.response if isinstance(response, Reply) else response
            headers = (getattr(reply, "_hidden_params", None) or {}).get("additional_headers") or {}
            told = told_limits({k.removeprefix("llm_provider-"): v for k, v in headers.items()})
            if any(told):
                self._stated(told)

    def _stated(self, limits: tuple[float | None, float | None]) -> None:
        """The provider stated these limits to this process: the pool paced at them, the other processes told."""
        self.pace.told = limits
        self._repace()
        if self.shared is not None:
            self.shared.told = limits

    # ------------------------------------------------------------ an outage

    def no_answer(self, call: object) -> None:
        """A request of ``call`` failed as an outage fails them all (no connection, a 5xx)."""
        self.outage.failing.setdefault(id(call), time.time())

    def has_answered(self, within_s: float) -> bool:
        """The endpoint answered this process, or another on the pool within ``within_s`` (an outage's patience):
        what tells an outage from an endpoint that never answered."""
        return self.total.successes > 0 or time.time() - self.outage.answered_at < within_s

    def went_down(self, call: object, connection: bool, hint: float | None, message: str, patience_s: float) -> bool:
        """``call`` has used its retries on an outage's failure: whether the pool is down (then it pauses, and one
        line says so). Not for an endpoint that never answered (it stays a fast exit 2: ``REFUSED_BEFORE_FATAL``),
        nor for one call's 5xx alone (its request may be what fails)."""
        out = self.outage
        if out.down_since is not None:
            return True
        if not self.has_answered(patience_s) or (not connection and len(out.failing.keys() - {id(call)}) < 1):
            return False
        out.down_since, out.probes = min(out.failing.values(), default=time.time()), 0
        self.total.outages += 1
        self.unflushed.outages += 1
        wait = self._probe_wait(hint)
        out.probe_at = time.time() + wait
        since = time.strftime("%H:%M:%S", time.localtime(out.down_since))
        log.warning("provider %s unreachable since %s; waiting, next try in %.1f s (%s)", self.label, since, wait,
                    message)
        return True

    def probe_failed(self, hint: float | None, patience_s: float) -> bool:
        """The probe found the endpoint still down: the next one later (capped backoff, or the wait a 503 asked),
        the last at the end of the patience; False when the patience is used up."""
        now = time.time()
        left = (self.outage.down_since or now) + patience_s - now
        if left <= 0:
            return False
        self.outage.probes += 1
        self.outage.probe_at = now + min(left, self._probe_wait(hint))
        return True

    def answers(self) -> None:
        """The endpoint answered (a reply, or a refusal that is an answer): an outage is over."""
        out = self.outage
        out.failing.clear()
        if out.down_since is not None:
            log.warning("provider %s answers again after %.0f s; sending resumed", self.label,
                        time.time() - out.down_since)
            out.down_since = None

    def _probe_wait(self, hint: float | None) -> float:
        return min(PROBE_CAP_S, hint if hint is not None else PROBE_BASE_S * 2 ** min(self.outage.probes, 30))

    def pause(self, seconds: float) -> None:
        self.pace.paused_until = max(self.pace.paused_until, time.time() + seconds)

    def _learned(self) -> None:
        self._repace()
        if self.shared is not None and self.pace.learner.rpm:  # taught or changed (not dropped: ``_settle``)
            self.shared.learned = (self.pace.learner.rpm, self.pace.learner.refused_rpm)

    # ------------------------------------------------------------ the other processes, the job's meter

    def sync(self, news: bool = False) -> None:
        """Exchange news with the other processes on the pool (a pause, a cut, stated or learned limits, who
        is calling), then count into the job's meter. At most every ``SYNC_S``, and at each 429 (``news``)."""
        self._sync_due = time.monotonic() + SYNC_S
        if self.shared is not None:
            seen = self.shared.exchange(self, news=news)
            if seen.cut:
                self.concurrency.rate_limited(time.monotonic())
            pace, m = self.pace, self.members
            if seen.told and not all(pace.configured) and seen.told != pace.told:
                pace.told = seen.told
                self._repace()
            if seen.learned is not None and pace.learning:
                pace.learner.adopt(*seen.learned, now=time.time())
                self._repace()
            if m.given.max_concurrency and seen.processes and abs(1.0 / seen.processes - m.share) > 1e-9:
                m.share = 1.0 / seen.processes
                self.concurrency.set_ceiling(self.bound)
        self.flush()

    def flush(self) -> None:
        """The pool's counts since the last flush into the job's meter, and where it stands (``pool/<label>``)."""
        if self.meter is None or not self.sent:
            return
        new = self.unflushed
        if new.answered_429 or new.wait_s:
            self.meter.pool_count(self.label, answered_429=new.answered_429, wait_s=new.wait_s)
        if new.outages:
            self.meter.pool_count(self.label, outages=new.outages)
        self.unflushed = Counts()
        self.meter.pool_state(self.label, peak_in_flight=self.peak, concurrency=int(self.concurrency.limit),
                              rpm=float(self.pace.pacer.rpm or 0.0))


_POOLS: dict[str, Pool] = {}
# A forked worker (runtime.workers, a sweep's later job) builds its own clients: it must not take the parent's
# pools, whose file locks refuse a process they were not made in, and whose state is the parent's share.
os.register_at_fork(after_in_child=_POOLS.clear)


def pool_for(litellm_model: str, api_base: str | None, api_key: str | None, *, named: str | None, config_id: str,
             max_concurrency: int, rpm: float | None, tpm: float | None, pools: Mapping[str, Any] | None,
             ledger_dir: Path | None, meter: UsageMeter | None = None) -> Pool:
    """The process's Pool for this model config (made on first use), which the config joins."""
    name = pool_name(litellm_model, api_base, named)
    ident = hashlib.sha256(json.dumps([name, api_key or ""]).encode()).hexdigest()[:16]
    pool = _POOLS.get(ident)
    if pool is None:
        taken = {p.label for p in _POOLS.values()}
        label = name if name not in taken else f"{name}-key{ident[:6]}"  # the same pool name with another key
        pool = _POOLS[ident] = Pool(ident, label, ledger_dir)
    pool.join(config_id, max_concurrency, rpm, tpm, PoolLimits(**dict((pools or {}).get(name) or {})), meter)
    return pool


def pool_metrics() -> dict[str, float]:
    """Progress metrics of each pool: requests in flight, the concurrency limit, the pace, 429s, seconds waited."""
    out: dict[str, float] = {}
    for pool in list(_POOLS.values()):
        if pool._concurrency is None or not pool.sent:  # not joined yet
            continue
        key = f"progress/pools/{pool.label}"
        out[f"{key}/in_flight"] = float(pool.concurrency.in_flight)
        out[f"{key}/concurrency"] = float(int(pool.concurrency.limit))
        out[f"{key}/wait_s"] = pool.total.wait_s
        out[f"{key}/answered_429"] = float(pool.total.answered_429)
        out[f"{key}/outages"] = float(pool.total.outages)
        if pool.pace.pacer.rpm:
            out[f"{key}/rpm"] = float(pool.pace.pacer.rpm)
    return out


def flush_pools() -> None:
    """Every pool's counts into its job's meter (the end of a job's calls)."""
    for pool in list(_POOLS.values()):
        pool.flush()


def forget_pools() -> None:
    """Tests: start the next client from a fresh state."""
    _POOLS.clear()

