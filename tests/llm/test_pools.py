"""A provider's pool is the unit of limits (issue 36): roles and snapshots on one pool share its concurrency
bound, its pace and its pauses, in one process and across processes; a provider that states nothing but
``retry-after`` teaches the pool its pace by its refusals; each pool's figures reach the metrics and the
``calls:`` line."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import pytest

from cupid_exp.config import CallsConfig, ConfigError, ModelConfig, PoolConfig, check_tree, config_digest
from cupid_exp.llm.client import LLMClient, configure_litellm
from cupid_exp.llm.limits import PACE_MARGIN, RefusalPace
from cupid_exp.llm.pool_state import SharedPoolState
from cupid_exp.llm.pools import Pool, PoolLimits, forget_pools, pool_name
from cupid_exp.llm.usage import UsageMeter, usage_line, usage_metrics
from cupid_exp.testing.stub_llm_server import StubServer

SUBJECT, EVALUATOR = "openai/gpt-4o-2024-08-06", "openai/gpt-4o-2024-11-20"  # the paper's two gpt-4o snapshots


@pytest.mark.parametrize("model,base,named,pool", [
    (SUBJECT, None, None, "openai-gpt-4o"),
    (EVALUATOR, "https://api.openai.com/v1", None, "openai-gpt-4o"),  # one family, one pool
    ("openai/gpt-4o-mini-2024-07-18", None, None, "openai-gpt-4o-mini"),
    ("openai/o3-mini-2025-01-31", None, None, "openai-o3-mini"),
    ("openai/gpt-4.1-nano-2025-04-14", None, None, "openai-gpt-4_1-nano"),  # a name Hydra overrides can address
    ("anthropic/claude-3-7-sonnet-20250219", None, None, "anthropic-claude-3-7-sonnet"),
    ("anthropic/claude-sonnet-4-5-20250929", None, None, "anthropic-claude-sonnet-4"),  # the Sonnet 4.x group
    ("anthropic/claude-sonnet-4-20250514", None, None, "anthropic-claude-sonnet-4"),
    (SUBJECT, "http://127.0.0.1:8011/v1", None, "api-127_0_0_1-8011-v1"),  # a proxy: one pool per base
    ("hosted_vllm/kixlab/prefmatcher-7b", "http://127.0.0.1:8011/v1", None, "api-127_0_0_1-8011-v1"),
    ("together_ai/Qwen/Qwen2.5-72B-Instruct-Turbo", None, None, "together_ai-Qwen-Qwen2_5-72B-Instruct-Turbo"),
    (SUBJECT, None, "org-a", "org-a"),  # the config names it
])
def test_each_provider_groups_its_models_into_pools(model: str, base: str | None, named: str | None,
                                                    pool: str) -> None:
    assert pool_name(model, base, named) == pool


def test_pool_settings_are_checked_and_leave_job_identities_alone() -> None:
    with pytest.raises(ConfigError, match=r"model.pool.name='a/b'"):
        check_tree(ModelConfig(name="m", litellm_model="openai/m", pool=PoolConfig(name="a/b")), "model")
    with pytest.raises(ConfigError, match=r"calls.pools.p.max_concurrency=0"):
        CallsConfig(cache_dir="c", pools={"p": {"max_concurrency": 0}}).check("calls")
    with pytest.raises(ConfigError, match=r"calls.pools.p=.*a mapping of rpm, tpm, max_concurrency"):
        CallsConfig(cache_dir="c", pools={"p": {"rpn": 3}}).check("calls")
    CallsConfig(cache_dir="c", pools={"openai-gpt-4o": {"rpm": 500, "tpm": 30000, "max_concurrency": 64}}
                ).check("calls")
    runtime = {"reask": 1}
    assert config_digest({"runtime": {**runtime, "pools": {}}}) == config_digest({"runtime": runtime})


def _clients(url: str, tmp_path: Path, *models: dict, pools: dict | None = None) -> tuple[list[LLMClient], UsageMeter]:
    forget_pools()
    rt = CallsConfig(cache_dir=str(tmp_path / "cache"), cache=False, num_retries=0, timeout=20,
                       pools=pools or {})
    configure_litellm(rt)
    meter = UsageMeter()
    return [LLMClient(ModelConfig(api_base=url, **m), rt, meter) for m in models], meter


def _ask(clients: list[LLMClient], n: int) -> float:
    async def go() -> None:
        await asyncio.gather(*(c.complete([{"role": "user", "content": f"{c.model.name} question {i}"}], step="s")
                               for c in clients for i in range(n)))

    start = time.perf_counter()
    asyncio.run(go())
    return time.perf_counter() - start


@pytest.mark.parametrize("pools,role_bound,bound", [(None, 4, 4), ({"shared": {"max_concurrency": 3}}, 8, 3)])
def test_two_configs_in_one_pool_never_hold_more_than_its_bound_in_flight_together(
        tmp_path: Path, pools: dict | None, role_bound: int, bound: int) -> None:
    """Each config alone keeps its bound; together, on one pool, they keep the pool's (the largest of theirs, or the
    one given once in calls.pools), not the sum: per-config bounds put 3 x 64 in flight where 64 were meant."""
    with StubServer(latency_ms=150) as stub:
        clients, _ = _clients(stub.url, tmp_path, *(
            {"name": name, "litellm_model": model, "max_concurrency": role_bound,
             "pool": PoolConfig(name="shared" if pools else None)}
            for name, model in (("subject", SUBJECT), ("evaluator", EVALUATOR))), pools=pools)
        assert clients[0].pool is clients[1].pool
        for _ in range(2):
            clients[0].pool.concurrency.succeeded(time.monotonic())  # past the slow start: the bound itself binds
        _ask(clients, 12)
        st = stub.stats()
    assert st["total_completed"] == 24
    assert st["peak_in_flight"] == bound, st["peak_in_flight"]


@pytest.mark.parametrize("given_once", [False, True])
def test_a_pool_paced_at_n_rpm_across_two_configs_sends_at_most_n_a_minute(tmp_path: Path, given_once: bool) -> None:
    """Both snapshots on a server that holds them in one 600 RPM pool (ten a second): paced per config, each
    sent its own ten a second and half were refused; paced per pool, none is."""
    n = 20  # per config: 40 requests, 3.9 s at 600 RPM
    with StubServer(rpm=600, limits_pool="key", latency_ms=20) as stub:
        per_config = {} if given_once else {"pool": PoolConfig(rpm=600)}
        clients, meter = _clients(stub.url, tmp_path, *(
            {"name": name, "litellm_model": model, "max_concurrency": 8, **per_config}
            for name, model in (("subject", SUBJECT), ("evaluator", EVALUATOR))),
            pools={pool_name(SUBJECT, stub.url): {"rpm": 600}} if given_once else None)
        elapsed = _ask(clients, n)
        st = stub.stats()
    assert st["total_completed"] == 2 * n
    assert st["rate_limited"] <= 1, st["rate_limited"]  # the stub refuses whatever passes 10 in one second
    assert elapsed >= (2 * n - 10) / 10  # the first second's ten at once, then ten a second
    metrics = usage_metrics(meter)
    pool = pool_name(SUBJECT, stub.url)
    assert metrics[f"pools/{pool}/rpm"] == 600 and metrics[f"pools/{pool}/answered_429"] == st["rate_limited"]
    assert metrics[f"pools/{pool}/wait_s"] > 1.0  # the pace held calls back


@pytest.mark.slow
def test_a_provider_that_states_only_retry_after_teaches_the_pool_its_pace(tmp_path: Path) -> None:
    """480 RPM in one-second windows, 429s with nothing but ``retry-after: 1``: before, the pool stayed unpaced
    (AIMD and pauses bound what is in flight, not how fast it goes out) and 29% of requests were refused.
    On the wire: the 429s teach a pace near what the stub admitted, and the pool's sends keep to it. How the pace
    fares after (its cuts and probes, the share refused) is the fake-clock tests' below: here a loaded CPU moves
    it (0-12% refused on a quiet machine, 22% in one CI run; beside eight busy loops, a cut was judged an overload
    in 1 run of 7 and the pool went unpaced for 4 s), so this test does not assert it."""
    with StubServer(rpm=480, limit_headers="retry-after", latency_ms=50) as stub:
        clients, meter = _clients(stub.url, tmp_path, {"name": "stub", "litellm_model": "openai/stub",
                                                        "max_concurrency": 8})
        client, pool, sends = clients[0], clients[0].pool, []
        record = pool.pace.learner.sent

        def sent(now: float) -> None:  # each send, with the pace it went out under (None: unpaced)
            sends.append((now, pool.pace.pacer.rpm if pool.pace.pacer.active else None))
            record(now)

        pool.pace.learner.sent = sent

        async def go() -> None:
            await asyncio.gather(*(client.complete([{"role": "user", "content": f"question {i}"}], step="s")
                                   for i in range(96)))  # twelve seconds at eight a second

        asyncio.run(go())
        st = stub.stats()
    assert st["total_completed"] == 96 and st["rate_limited"] > 0  # the limit refused: there was a lesson
    paced = [(t, rpm) for t, rpm in sends if rpm is not None]
    assert len(paced) >= 32, len(paced)  # unpaced, none is
    # the first pace taught is what the stub admitted over the refusals' span (at least a second): eight a window, but
    # a span of s seconds can hold parts of ceil(s) + 1 windows, so a burst across a window's turn teaches up to about
    # three times the limit (720 and 962 seen on a busy CPU; an overestimate the pace's cuts must then undo: known)
    assert 0.5 * 480 <= paced[0][1] <= 3 * 480, paced[0]
    for i, (t, _) in enumerate(paced):  # no second holds more paced sends than the pace's share of it, rounded up
        # (less 20 ms: the pacer reads the clock a moment before the send is recorded, longer on a busy CPU)
        window = [(u, rpm) for u, rpm in paced[i:] if u < t + 0.98]
        assert len(window) <= math.ceil(max(r for _, r in window) * PACE_MARGIN / 60), (window[-1][0] - t, window)
    assert usage_metrics(meter)[f"pools/{pool.label}/answered_429"] == st["rate_limited"]


def _first_lesson(learner: RefusalPace) -> bool:
    """Sixteen sent at once to a window that allows eight: the ninth to the sixteenth refused, as a limit refuses
    (every request once its window is spent). Whether the last refusal changed the pace."""
    for i in range(16):
        learner.sent(100.0 + i * 0.025)
    changed, news = [], []
    for i in range(8):
        changed.append(learner.refused(100.4 + i * 0.01, hint=1.0))
        news.append(learner.news)
    # the first pauses the pool; two more, not yet a limit's share (a quarter of what was sent, at least 20)
    assert news[:4] == [True, False, False, False] and changed[:4] == [False] * 4, (news, changed)
    return any(changed[4:])


def test_the_first_refusals_teach_what_was_admitted_and_probes_stay_under_the_refused_pace() -> None:
    learner = RefusalPace()
    assert _first_lesson(learner)
    assert learner.rpm == pytest.approx(60 * 8)  # eight in the second the refusals measured
    for i in range(27):  # then paced a little too fast: nine a second, two of them refused
        learner.sent(101.0 + i / 9)
    learner.refused(103.0, hint=1.0)
    assert learner.refused(104.0, hint=1.0)  # a cut: to what was admitted, or x0.9 where that is more
    assert learner.rpm == pytest.approx(480 * 0.9)
    assert not learner.refused(105.0, hint=1.0)  # within the cooldown: one cut at most
    for t in range(106, 130):  # the cut pace binds, none refused: the cut is judged to stand, then probed
        for i in range(7):
            learner.sent(t + i / 7)
        learner.binding(float(t))
    assert learner.rpm == pytest.approx(480 * 0.97)  # probed back, to just under the pace that was refused
    learner.binding(200.0)  # a minute without a refusal: probing may pass it again
    assert learner.rpm > 480


def test_probes_after_the_first_lesson_stay_near_it_and_a_refused_probe_is_answered_at_once() -> None:
    """Before, the first lesson left the probes uncapped (+15% a second until a refusal), and a refusal within
    the cooldown of the lesson was ignored even when a probe had raised the pace since: the pace went on up."""
    from cupid_exp.llm.limits import FIRST_HEADROOM, PROBE_CEILING

    learner = RefusalPace()
    assert _first_lesson(learner) and learner.rpm == pytest.approx(480)
    for t in range(101, 110):
        learner.binding(float(t))
    assert learner.rpm == pytest.approx(480 * FIRST_HEADROOM * PROBE_CEILING)  # not 480 x 1.15^9
    probed = learner.rpm
    learner = RefusalPace()
    _first_lesson(learner)
    assert learner.binding(101.5)  # a probe, then its refusal 1 s later: inside the lesson's cooldown
    for i in range(10):
        learner.sent(101.5 + i * 0.1)
    assert learner.refused(102.5, hint=1.0) and learner.rpm < 480  # cut at once
    assert learner.refused_rpm == pytest.approx(probed) and probed < 480 * FIRST_HEADROOM  # probes stay under it


def test_a_window_closed_from_the_start_teaches_no_pace() -> None:
    learner = RefusalPace()
    for i in range(10):
        learner.sent(100.0 + i * 0.01)
        assert not learner.refused(100.0 + i * 0.01, hint=1.0)  # nothing admitted yet: nothing to learn
    assert learner.rpm is None


def _paced_job(learner: RefusalPace, refuse: Any, start: float, seconds: float = 120.0, demand: float = 30.0,
               latency: float = 0.2) -> list[float]:
    """A job that would send ``demand`` requests a second, held to the learned pace once there is one, on a fake
    clock from ``start``; ``refuse(t)`` says whether the provider refuses the request sent at ``t`` (its 429
    arrives ``latency`` later). The send times."""
    t, sends, replies = start, [], deque()
    while t < start + seconds:
        while replies and replies[0][0] <= t:
            at, refused = replies.popleft()
            if refused:
                learner.refused(at, hint=2.0)
        gap = 1.0 / demand
        if learner.rpm is not None and 60.0 / learner.rpm > gap:  # the pace holds the job back
            learner.binding(t)
            gap = 60.0 / learner.rpm if learner.rpm is not None else gap  # (a probe, or the pace dropped)
        learner.sent(t)
        sends.append(t)
        replies.append((t + latency, refuse(t)))
        t += gap
    return sends


def _per_second(sends: list[float], since: float, until: float) -> float:
    return sum(1 for t in sends if since <= t < until) / (until - since)


@pytest.mark.parametrize("seed", range(3))
def test_refusals_that_do_not_fall_when_the_pace_falls_leave_the_pace_to_the_job(seed: int) -> None:
    """An overloaded provider refuses 10% of requests at any pace (``retry-after: 2``). Before, each 429 cut the
    pace (x0.9 per cooldown, the probes capped under the pace refused): a job that sends 30 a second was down
    to about one a second after two minutes. The cut is now judged by the refusals that follow it."""
    rng = random.Random(seed)
    learner = RefusalPace()
    sends = _paced_job(learner, lambda t: rng.random() < 0.1, start=1000.0)
    assert _per_second(sends, 1060.0, 1120.0) >= 0.7 * 30  # the second minute: at least 70% of the job's pace


@pytest.mark.parametrize("seed", range(8))
def test_sparse_refusals_from_the_start_keep_the_pace_and_seldom_pause_the_pool(seed: int) -> None:
    """An overloaded provider from the first request (10% refused at random, ``retry-after: 2``): before, the first
    refusal taught a pace and paused the pool, and the job ran at a reduced pace until a cut was judged an
    overload (8-9 s of a synthesis job). Refusals now teach only when they come together (a limit's: a quarter of
    what was sent in a second); only the first pauses the pool otherwise (news), so that a limit's burst is not met
    by a second one. A chance cluster of the overload's may still teach for a while (seed 7: 5 of the first 18)."""
    class Recorded(RefusalPace):
        def refused(self, now: float, hint: float | None) -> bool:
            changed = super().refused(now, hint)
            said.append(self.news)
            return changed

    said: list[bool] = []
    rng = random.Random(seed)
    sends = _paced_job(Recorded(), lambda t: rng.random() < 0.1, start=1000.0, seconds=60.0)
    assert len(said) > 100 and said[0]  # the refusals happened; the first paused the pool
    assert sum(said) <= 8, sum(said)  # pauses: a few at most, not one every tenth request
    assert _per_second(sends, 1000.0, 1060.0) >= 0.9 * 30


def test_refusals_that_fall_when_the_pace_falls_still_cut_it() -> None:
    """A limit (ten a second, in one-second windows) met by a job that would send 30: the pace comes down to it
    and stays there; few requests refused."""
    windows: Counter = Counter()

    def limit(t: float) -> bool:
        windows[int(t)] += 1
        return windows[int(t)] > 10

    learner = RefusalPace()
    sends = _paced_job(learner, limit, start=1000.0)
    assert 8.5 <= _per_second(sends, 1060.0, 1120.0) <= 10.5
    refused = sum(n - 10 for n in windows.values() if n > 10)
    assert refused <= 0.05 * len(sends), (refused, len(sends))
    assert learner.rpm is not None and learner.rpm <= 1.05 * 600  # still paced, at the limit (not dropped)


def test_a_refusal_judged_an_overload_pauses_no_caller_and_keeps_the_calls_in_flight() -> None:
    """Before, every 429 saying ``retry-after: 2`` held every caller of the pool for 2 s and cut the AIMD limit:
    10% refused was a pause every tenth request. Now only the refused call waits what it was asked."""
    rng = random.Random(0)
    pool = Pool("overloaded", "overloaded", None)
    pool.join("cfg", 16, None, None, PoolLimits(), None)
    _paced_job(pool.pace.learner, lambda t: rng.random() < 0.1, start=time.time() - 60.0, seconds=60.0)
    limit, paused = pool.concurrency.limit, pool.pace.paused_until
    pool.rate_limited((None, None), 2.0, 2.0)
    assert pool.pace.paused_until == paused and pool.concurrency.limit == limit
    assert pool.total.answered_429 == 1  # counted all the same


def test_processes_on_one_pool_share_its_pause_stated_limits_cut_and_given_bound(tmp_path: Path) -> None:
    """Two processes on one key (a job's workers, or two parallel jobs): the second follows the first's 429 within a
    sync, and a bound given once is split between them."""
    first, second = (Pool("p", "p", tmp_path) for _ in range(2))
    second.shared = SharedPoolState(tmp_path / "p.pool.json", me="another process")
    for pool in (first, second):
        pool.join("cfg", 16, None, None, PoolLimits(max_concurrency=8), None)
        pool.sync()
    assert (first.bound, second.bound) == (8, 4)  # the first synced alone, the second after it
    first.sync()
    assert first.bound == 4
    limit_before = second.concurrency.limit
    first.rate_limited((300.0, None), hint=2.0, wait=2.0)  # a 429 stating the key's limit, "wait 2 s"
    second.sync()
    assert second.pace.paused_until >= time.time() + 1.5
    assert second.pace.pacer.rpm == 300 and second.concurrency.limit < limit_before


def test_each_pools_figures_reach_the_metrics_and_the_calls_line() -> None:
    """The job's process and a worker each had half the pool: their peaks and limits add up, the pace is the one
    they shared."""
    job, worker, sent = UsageMeter(), UsageMeter(), {}
    job.pool_count("openai-gpt-4o", answered_429=2, wait_s=1.0)
    job.pool_state("openai-gpt-4o", peak_in_flight=32, concurrency=30, rpm=300.0)
    worker.pool_count("openai-gpt-4o", answered_429=1, wait_s=0.5)
    worker.counts["pool/openai-gpt-4o"].update({"peak_in_flight@1": 32, "concurrency@1": 32, "rpm@1": 300.0})
    job.merge(worker.since(sent))
    metrics = usage_metrics(job)
    assert metrics["pools/openai-gpt-4o/peak_in_flight"] == 64 and metrics["pools/openai-gpt-4o/concurrency"] == 62
    assert metrics["pools/openai-gpt-4o/rpm"] == 300 and metrics["pools/openai-gpt-4o/answered_429"] == 3
    assert "calls/pool/openai-gpt-4o" not in metrics and metrics["calls/total"] == 0  # a pool is not a step
    assert ("pool openai-gpt-4o: 64 in flight at most, limit 62, paced at 300 RPM, 3 answered 429, 1.5 s waited"
            in usage_line(metrics))


def test_a_sweeps_next_job_on_the_pool_starts_from_its_own_configs(tmp_path: Path) -> None:
    """Jobs of a sweep run one after the other in one process: the second's configs set the bound and the pace,
    not the first's (what the pool learned from the provider carries over)."""
    pool = Pool("p", "p", None)
    pool.join("first job", 64, 500.0, None, PoolLimits(), UsageMeter())
    pool.pace.told = (300.0, None)
    pool.join("second job", 16, None, None, PoolLimits(), UsageMeter())
    assert pool.bound == 16 and pool.pace.configured == (None, None)
    pool._repace()
    assert pool.pace.pacer.rpm == 300  # the stated limit, learned in the first job


def test_a_sweeps_next_job_meets_a_lone_5xx_as_a_failure_not_an_outage() -> None:
    """A call of the first job that failed on a 5xx and never got an answer after it is no evidence of an outage in
    the next job of the same process: the next job's lone 5xx is its request's own failure."""
    pool = Pool("p", "p", None)
    pool.join("first job", 4, None, None, PoolLimits(), UsageMeter())
    pool.succeeded()
    earlier = object()
    pool.no_answer(earlier)  # its last call failed; the job ended on it
    pool.join("second job", 4, None, None, PoolLimits(), UsageMeter())
    call = object()
    pool.no_answer(call)
    assert not pool.went_down(call, connection=False, hint=None, message="500", patience_s=60.0)
    assert pool.outage.down_since is None


def _sync_in_child(ledger: str, out: Any) -> None:
    from cupid_exp.llm.pools import _POOLS, pool_for

    inherited = len(_POOLS)
    pool = pool_for("openai/stub", "http://127.0.0.1:1/v1", None, named=None, config_id="c", max_concurrency=4,
                    rpm=None, tpm=None, pools=None, ledger_dir=Path(ledger))
    pool.sync()  # the parent's pool here: its file lock refused this process
    out.put(inherited)


def test_a_forked_worker_builds_its_own_pools(tmp_path: Path) -> None:
    """A sweep's later job forks its calls worker after the first job made the pools: the worker must not take
    them (their file locks refuse a process they were not made in: the worker died on its first call)."""
    import multiprocessing

    from cupid_exp.llm.pools import pool_for

    forget_pools()
    pool_for("openai/stub", "http://127.0.0.1:1/v1", None, named=None, config_id="c", max_concurrency=4, rpm=None,
             tpm=None, pools=None, ledger_dir=tmp_path).sync()
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_sync_in_child, args=(str(tmp_path), out))
    child.start()
    child.join(30)
    assert child.exitcode == 0 and out.get(timeout=5) == 0
