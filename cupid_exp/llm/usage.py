"""What every model call costs and how it ended, per step; the one place usage becomes metrics. A request counts in
flight at its worst case until its call settles it, so after ``kill -9`` the spend shown is never below the bill."""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Mapping

POOL = "pool/"  #: the prefix of a pool's entry among the steps


@dataclass
class Completion:
    """One successful call: the reply text and what it cost."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0  #: None: the model is not in litellm's price map (counted, never guessed)
    cached: bool = False
    seconds: float = 0.0
    retries: int = 0  #: requests repeated after a transient failure before this one succeeded
    rate_limited: int = 0  #: requests repeated after a 429 (rate limit) before this one succeeded
    limit_wait_s: float = 0.0  #: seconds this call waited on rate limits (429s, pauses, pacing)
    finish_reason: str | None = None  #: "length" when the reply was cut at max_tokens, "content_filter": refused
    refusal: str | None = None  #: the provider's refusal message (OpenAI structured outputs), if any
    batch_cost_usd: float | None = None  #: a dry run's estimate at the Batch API's prices, where there are some
    usage_estimated: bool = False  #: the reply carried no usage: its tokens were counted here (``llm.billing``)
    charged_usd: float = 0.0  #: earlier attempts of the call without a usable reply, as billed (``llm.billing``)
    charged_requests: int = 0  #: how many such attempts

    @property
    def refused(self) -> bool:
        """The provider withheld the answer: its content filter stopped it, or the model refused."""
        return self.finish_reason == "content_filter" or bool(self.refusal)


@dataclass(frozen=True)
class WorstCase:
    """An upper bound on what one request is billed, counted while it is in flight."""

    usd: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def in_flight(self, requests: int) -> dict[str, float]:
        """The counts of ``requests`` such requests in flight (negative: settled)."""
        if not requests:
            return {}
        return {"in_flight": requests, "in_flight_usd": requests * self.usd,
                "in_flight_prompt_tokens": requests * self.prompt_tokens,
                "in_flight_completion_tokens": requests * self.completion_tokens}


_IN_FLIGHT = ("in_flight", "in_flight_usd", "in_flight_prompt_tokens", "in_flight_completion_tokens")


def charged_unsettled(counts: dict[str, float]) -> dict[str, float]:
    """``counts`` with the requests still in flight charged their worst case."""
    out = {k: v for k, v in counts.items() if k not in _IN_FLIGHT}
    n = counts.get("in_flight", 0.0)
    if n >= 0.5:  # counts of whole requests: a settled one leaves 0 (its dollars may leave a float's rounding)
        for key, into in (("in_flight_usd", "cost_usd"), ("in_flight_prompt_tokens", "prompt_tokens"),
                          ("in_flight_completion_tokens", "completion_tokens")):
            out[into] = out.get(into, 0.0) + counts.get(key, 0.0)
        out["unsettled"] = out.get("unsettled", 0.0) + n
        out["charged_requests"] = out.get("charged_requests", 0.0) + n
    return out


@dataclass
class BatchCounts:
    """What a job's batches did, for the progress line, the summary and MLflow."""

    submitted: int = 0  #: batches this job created
    collected: int = 0  #: batches (this job's or an earlier run's) whose results were read
    expired: int = 0
    failed: int = 0  #: batches the provider rejected as a whole
    rows_submitted: int = 0
    rows_resubmitted: int = 0  #: rows sent again after a retryable failure or an expiry
    rows_reused: int = 0  #: replies served from the ledger (an earlier run's batch: no cost)
    rows_shared: int = 0  #: calls answered by a row another identical call of the job asked for (one cost)
    rows_unreadable: int = 0  #: result lines that could not be read (answered and billed): their rows sent again
    held_token_limit: int = 0  #: batches the provider rejected for its enqueued-token limit, held and sent again
    pending: int = 0  #: batches in flight now
    ids: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        return {f"batch/{k}": float(v) for k, v in vars(self).items() if k != "ids"}


@dataclass
class UsageMeter:
    """Per-step counters of a job's clients; ``sink`` (the usage ledger) hears every count as it is made."""

    counts: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))
    sink: Callable[[str, dict[str, float]], None] | None = None
    batches: BatchCounts = field(default_factory=lambda: BatchCounts())  #: the Batch API's side (calls.batch)

    def _count(self, step: str, added: dict[str, float]) -> None:
        self.merge({step: added})
        if self.sink is not None:
            self.sink(step, added)

    def sending(self, step: str, worst: WorstCase) -> None:
        """A request about to be sent, counted in flight at its worst case until its call settles it."""
        self._count(step, worst.in_flight(1))

    def add(self, step: str, completion: Completion, settled: Mapping[str, float] = {}) -> None:
        """A call answered (``completion``); from the cache, only a cache hit: nothing was billed for it."""
        if completion.cached:
            added: dict[str, float] = {"cache_hits": 1, "retries": completion.retries}
        else:
            added = {"calls": 1, "retries": completion.retries, "prompt_tokens": completion.prompt_tokens,
                     "completion_tokens": completion.completion_tokens}
        if completion.rate_limited or completion.limit_wait_s:
            added.update(rate_limited=completion.rate_limited, limit_wait_s=completion.limit_wait_s)
        if completion.cost_usd is None:
            added["unpriced_calls"] = 1
        elif not completion.cached:
            added["cost_usd"] = completion.cost_usd
        if completion.usage_estimated and not completion.cached:
            added["estimated_usage_calls"] = 1
        _charges(added, completion.charged_usd, completion.charged_requests)
        if completion.batch_cost_usd is not None:
            added["batch_cost_usd"] = completion.batch_cost_usd
        self._count(step, _plus(added, settled))

    def fail(self, step: str, kind: str, retries: int = 0, rate_limited: int = 0, wait_s: float = 0.0,
             charged_usd: float = 0.0, charged: int = 0, settled: Mapping[str, float] = {}) -> None:
        """A call failed for good after ``retries`` (``rate_limited`` after a 429, ``wait_s`` waited); ``charged_usd``:
        its billed attempts without a usable reply."""
        added: dict[str, float] = {f"failed_{kind}": 1, "retries": retries}
        if rate_limited or wait_s:
            added.update(rate_limited=rate_limited, limit_wait_s=wait_s)
        _charges(added, charged_usd, charged)
        self._count(step, _plus(added, settled))

    def abandon(self, step: str, sent: int, charged_usd: float = 0.0, charged: int = 0,
                settled: Mapping[str, float] = {}) -> None:
        """A call ended unanswered after ``sent`` requests (budget, or the job stopped); its bill is counted."""
        added: dict[str, float] = {"abandoned_requests": sent}
        _charges(added, charged_usd, charged)
        self._count(step, _plus(added, settled))

    def charge(self, step: str, usd: float, requests: int, settled: Mapping[str, float] = {}) -> None:
        """``requests`` billed without a usable reply, their call counted apart (unreadable batch rows)."""
        added: dict[str, float] = {**settled}
        _charges(added, usd, requests)
        if added:
            self._count(step, added)

    def refuse(self, step: str, reason: str = "oversized") -> None:
        """A call not sent: it overflows the context (``oversized``) or the budget (``budget``)."""
        self._count(step, {f"not_sent_{reason}": 1})

    def reject(self, step: str, kind: str) -> None:
        """A reply that could not be used (``unparseable``, ``invalid``, ``truncated``, ``content_filter``)."""
        self._count(step, {f"{kind}_attempt": 1})

    def kept_cut(self, step: str) -> None:
        """A reply cut at max_tokens that its step uses as it is (``llm.steps.ask``'s ``keep_cut``)."""
        self._count(step, {"truncated_kept": 1})

    def gave_up(self, step: str) -> None:
        """A step that ran out of attempts on unusable replies."""
        self._count(step, {"gave_up": 1})

    def pool_count(self, pool: str, **added: float) -> None:
        """A pool's 429s, seconds waited and outages met (``cupid_exp.llm.pools.Pool.flush``)."""
        self._count(POOL + pool, added)

    def pool_state(self, pool: str, **values: float) -> None:
        """Where a pool stands in this process, per process id; not sent to the sink."""
        self.counts[POOL + pool].update({f"{key}@{os.getpid()}": value for key, value in values.items()})

    def charge_unsettled(self) -> None:
        """Charge the requests still in flight their worst case (a meter of ended attempts)."""
        for step, values in self.as_dict().items():
            self.counts[step] = defaultdict(float, charged_unsettled(values))

    def merge(self, counts: dict[str, dict[str, float]]) -> None:
        """Add another meter's counts, step by step; not sent to the sink (that meter's did)."""
        for step, values in counts.items():
            mine = self.counts[step]
            for key, value in values.items():
                mine[key] += value

    def since(self, sent: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        """What was counted since the counts in ``sent``, which become the current ones (for ``merge``)."""
        out: dict[str, dict[str, float]] = {}
        for step, values in self.as_dict().items():
            before = sent.setdefault(step, {})
            changed = {k: v - before.get(k, 0.0) for k, v in values.items() if v != before.get(k, 0.0)}
            if changed:
                out[step] = changed
                before.update(values)
        return out

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for c in self.counts.values():
            for k, v in c.items():
                out[k] += v
        return dict(out)

    def as_dict(self) -> dict[str, dict[str, float]]:
        return {step: dict(c) for step, c in self.counts.items()}


def _plus(added: dict[str, float], more: Mapping[str, float]) -> dict[str, float]:
    return {**added, **{k: added.get(k, 0.0) + v for k, v in more.items()}}


def _charges(added: dict[str, float], usd: float, requests: int) -> None:
    if usd or requests:
        added["cost_usd"] = added.get("cost_usd", 0.0) + usd
        added["charged_requests"] = requests


def failed_calls(counts: dict[str, float]) -> float:
    return sum(v for k, v in counts.items() if k.startswith("failed_"))


def requests_sent(counts: dict[str, float]) -> float:
    """Requests that reached a provider: successes, failures, every retry, and the unsettled."""
    return (counts.get("calls", 0.0) + failed_calls(counts) + counts.get("retries", 0.0)
            + counts.get("rate_limited", 0.0) + counts.get("abandoned_requests", 0.0) + counts.get("unsettled", 0.0))


def usage_metrics(meter: UsageMeter) -> dict[str, float]:
    """Flat MLflow metrics (``calls/<step>``, ``cost/usd``, ...): billed calls and tokens, in-flight at worst case."""
    out: dict[str, float] = {}
    steps = {step: charged_unsettled(counts) for step, counts in meter.as_dict().items()}
    for step, counts in steps.items():
        if step.startswith(POOL):
            out.update(_pool_metrics(step[len(POOL):], counts))
            continue
        out[f"calls/{step}"] = counts.get("calls", 0.0)
        out[f"calls/{step}/cache_hits"] = counts.get("cache_hits", 0.0)
        out[f"calls/{step}/failed"] = failed_calls(counts)
        out[f"tokens/{step}/prompt"] = counts.get("prompt_tokens", 0.0)
        out[f"tokens/{step}/completion"] = counts.get("completion_tokens", 0.0)
        for key, value in counts.items():
            if key.endswith("_attempt") or key.startswith("failed_") or key == "truncated_kept":
                out[f"calls/{step}/{key}"] = value
    totals = UsageMeter(steps).totals()
    out["calls/total"] = totals.get("calls", 0.0)
    out["calls/cache_hits"] = totals.get("cache_hits", 0.0)
    out["calls/requests"] = requests_sent(totals)
    out["calls/retries"] = totals.get("retries", 0.0)
    out["calls/rate_limited"] = totals.get("rate_limited", 0.0)
    out["calls/limit_wait_s"] = totals.get("limit_wait_s", 0.0)
    out["calls/failed"] = failed_calls(totals)
    out["calls/unusable_replies"] = sum(v for k, v in totals.items() if k.endswith("_attempt"))
    out["calls/unpriced"] = totals.get("unpriced_calls", 0.0)
    out["calls/not_sent_oversized"] = totals.get("not_sent_oversized", 0.0)
    out["calls/unsettled"] = totals.get("unsettled", 0.0)  # sent by an attempt that ended first: charged worst case
    out["tokens/estimated_calls"] = totals.get("estimated_usage_calls", 0.0)  # replies without usage: counted here
    out["cost/charged_requests"] = totals.get("charged_requests", 0.0)  # billed without a usable reply
    out["tokens/prompt"] = totals.get("prompt_tokens", 0.0)
    out["tokens/completion"] = totals.get("completion_tokens", 0.0)
    out["cost/usd"] = totals.get("cost_usd", 0.0)
    if "batch_cost_usd" in totals:  # a dry run: the estimate at the Batch API's prices too (calls.batch)
        out["cost/usd_at_batch_prices"] = totals["batch_cost_usd"]
    if meter.batches.submitted or meter.batches.rows_reused or meter.batches.collected:
        out.update(meter.batches.metrics())
    return out


def _pool_metrics(pool: str, counts: dict[str, float]) -> dict[str, float]:
    """``pools/<name>/…``: the processes' peaks and limits summed, and their shared pace."""
    def each(key: str) -> list[float]:
        return [v for k, v in counts.items() if k.startswith(key + "@")]

    return {f"pools/{pool}/peak_in_flight": sum(each("peak_in_flight")),
            f"pools/{pool}/concurrency": sum(each("concurrency")),
            f"pools/{pool}/rpm": max(each("rpm"), default=0.0),
            f"pools/{pool}/answered_429": counts.get("answered_429", 0.0),
            f"pools/{pool}/wait_s": counts.get("wait_s", 0.0),
            **({f"pools/{pool}/outages": counts["outages"]} if counts.get("outages") else {})}


def usage_line(metrics: dict[str, float], seconds: float | None = None) -> str:
    """The console's one-line account of calls, requests, tokens and cost (each aside only where it has a count)."""
    def n(key: str) -> int:
        return int(metrics.get(key, 0))

    waited = metrics.get("calls/limit_wait_s", 0.0)
    limits = (f", {n('calls/rate_limited')} after a 429, {waited:.1f} s waiting on rate limits"
              if n("calls/rate_limited") or waited >= 0.05 else "")
    estimated = f" ({n('tokens/estimated_calls')} calls' usage estimated)" if n("tokens/estimated_calls") else ""
    charged = (f" ({n('cost/charged_requests')} requests without a usable reply charged)"
               if n("cost/charged_requests") else "")  # timed out or lost after sending (their worst case), empty
    line = (f"calls: {n('calls/total') + n('calls/cache_hits')} ok ({n('calls/cache_hits')} cached), "
            f"{n('calls/failed')} failed; requests sent: {n('calls/requests')} ({n('calls/retries')} retries{limits})"
            f"{_pools_part(metrics)}; tokens: {n('tokens/prompt')} in / {n('tokens/completion')} out{estimated}; "
            f"cost: ${metrics.get('cost/usd', 0.0):.4f}{charged}")
    if n("batch/submitted") or n("batch/rows_reused"):
        unreadable = f", {n('batch/rows_unreadable')} unreadable" if n("batch/rows_unreadable") else ""
        line += (f"; batches: {n('batch/submitted')} submitted ({n('batch/rows_submitted')} rows, "
                 f"{n('batch/rows_resubmitted')} resent{unreadable}), {n('batch/expired')} expired, "
                 f"{n('batch/rows_reused')} rows reused")
    return line + (f"; time: {seconds:.1f}s" if seconds is not None else "")


def _pools_part(metrics: dict[str, float]) -> str:
    """"; pool openai-gpt-4o: 64 in flight at most, limit 64, paced at 300 RPM, 5 answered 429, 3.1 s waited"."""
    pools = sorted(k[len("pools/"):-len("/peak_in_flight")] for k in metrics
                   if k.startswith("pools/") and k.endswith("/peak_in_flight"))
    parts = []
    for pool in pools:
        m = {k.rsplit("/", 1)[1]: v for k, v in metrics.items() if k.startswith(f"pools/{pool}/")}
        paced = f", paced at {m['rpm']:.0f} RPM" if m.get("rpm") else ""
        parts.append(f"pool {pool}: {int(m['peak_in_flight'])} in flight at most, limit {int(m['concurrency'])}"
                     f"{paced}, {int(m['answered_429'])} answered 429, {m['wait_s']:.1f} s waited")
    return "".join("; " + p for p in parts)
