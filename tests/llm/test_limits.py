"""A pool's limits: AIMD concurrency (429s lower the calls in flight, success brings them back), pacing at
``rpm``/``tpm`` (shared by processes through a ledger file), the limits a provider states learned from a 429."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from cupid_exp.config import CallsConfig, ConfigError, ModelConfig, PoolConfig, check_tree
from cupid_exp.llm.client import LLMClient, configure_litellm
from cupid_exp.llm.limits import COOLDOWN_S, MIN_GAP, PACE_MARGIN, AdaptiveLimit, Pacer, estimated_tokens
from cupid_exp.llm.pools import forget_pools
from cupid_exp.llm.usage import UsageMeter, usage_line, usage_metrics
from cupid_exp.testing.stub_llm_server import StubServer


def test_aimd_lowers_the_calls_in_flight_on_429s_and_recovers() -> None:
    async def run() -> tuple[list[int], float, float]:
        limit = AdaptiveLimit(10)
        assert limit.limit == 4  # slow start: a quarter, at least 4
        for _ in range(6):
            limit.succeeded(now=0.0)  # +1 per success up to max_concurrency
        assert limit.limit == 10
        peak: list[int] = []

        async def call(i: int) -> None:
            await limit.acquire()
            peak.append(limit.in_flight)
            await asyncio.sleep(0.01)
            limit.release()

        limit.rate_limited(now=100.0)
        limit.rate_limited(now=100.5)  # within the cooldown: one cut
        cut = limit.limit
        await asyncio.gather(*(call(i) for i in range(40)))
        for i in range(200):  # a long stretch of successes after the cooldown
            limit.succeeded(now=100.0 + COOLDOWN_S + i)
        return peak, cut, limit.limit

    peak, cut, recovered = asyncio.run(run())
    assert cut == pytest.approx(8.0) and max(peak) == 8
    assert recovered == 10.0  # back to the ceiling, never above


def test_aimd_never_goes_under_one() -> None:
    limit = AdaptiveLimit(4)
    for i in range(50):
        limit.rate_limited(now=i * COOLDOWN_S)
    assert limit.limit == 1.0


def test_the_pacer_spaces_requests_and_tokens_across_processes(tmp_path: Path) -> None:
    ledger = tmp_path / "rate_limits" / "endpoint.json"
    first, second = Pacer(600, None, ledger), Pacer(600, None, ledger)  # two processes on one key: 10/s together
    # four requests at one moment (``now``: the pacer's clock, not the time a busy CPU took between the calls)
    t0 = time.time()
    waits = [p.reserve(10, now=t0) for p in (first, second, first, second)]
    assert waits[0] == 0.0
    assert waits[1:] == pytest.approx([0.1 / PACE_MARGIN, 0.2 / PACE_MARGIN, 0.3 / PACE_MARGIN], abs=1e-5)
    tokens = Pacer(None, 60_000, None)  # 1,000 tokens a second
    assert tokens.reserve(2_000, now=t0) == 0.0
    assert tokens.reserve(10, now=t0) == pytest.approx(2.0 / PACE_MARGIN, abs=1e-5)


def test_no_second_holds_more_than_the_paced_share_of_sends(tmp_path: Path) -> None:
    """Callers whose wake-ups a busy CPU delayed come due together: the send-time check holds back all but the
    second's share, rounded up (600 RPM at the PACE_MARGIN of 0.98: 9.8, so 10 a second), in one process and
    across the ledger; and none goes out within half the pace's spacing of the last one."""
    gap = MIN_GAP * 60 / (600 * PACE_MARGIN)
    for first, second in ((Pacer(600, None, None),) * 2,
                          (Pacer(600, None, tmp_path / "l.json"), Pacer(600, None, tmp_path / "l.json"))):
        t0 = time.time()
        assert first.admit(now=t0) == 0.0
        assert second.admit(now=t0 + gap / 2) == pytest.approx(gap / 2, abs=1e-4)  # too close to the last send
        waits = [p.admit(now=t0 + i * gap) for i, p in zip(range(1, 14), (second, first) * 7, strict=False)]
        assert waits[:9] == [0.0] * 9  # ten in the first second, sent in 0.46 s
        assert all(w == pytest.approx(1.0 - (i + 10) * gap, abs=1e-4) for i, w in enumerate(waits[9:]))
    assert Pacer(None, 60_000, None).admit() == 0.0  # tokens alone: their own schedule, no count of sends


@pytest.mark.parametrize("rpm,per_second", [(300, 5), (90, 2), (3000, 49), (60, 1)])
def test_the_send_time_check_admits_the_seconds_share_rounded_up(rpm: int, per_second: int) -> None:
    """Rounded down, 300 RPM admitted 4 sends a second (240 RPM): every paced job ran 20% under its limit."""
    pacer, t0 = Pacer(rpm, None, None), time.time()
    gap = MIN_GAP * 60 / (rpm * PACE_MARGIN)
    waits = [pacer.admit(now=t0 + i * gap) for i in range(per_second + 1)]
    assert waits[:per_second] == [0.0] * per_second and waits[per_second] > 0


def test_tokens_are_counted_as_openai_counts_them() -> None:
    messages = [{"role": "system", "content": "x" * 400}, {"role": "user", "content": "y" * 800}]
    assert estimated_tokens(messages, 4096) == 300 + 4096


def test_rpm_and_tpm_are_checked() -> None:
    with pytest.raises(ConfigError, match="model.pool.rpm"):
        check_tree(ModelConfig(name="m", litellm_model="openai/m", pool=PoolConfig(rpm=0)), "model")
    check_tree(ModelConfig(name="m", litellm_model="openai/m", pool=PoolConfig(rpm=300, tpm=400_000)), "model")


def _run(url: str, tmp_path: Path, n: int, **model) -> tuple[UsageMeter, float]:
    forget_pools()
    rt = CallsConfig(cache_dir=str(tmp_path / "cache"), cache=False, num_retries=0, timeout=10)
    configure_litellm(rt)
    meter = UsageMeter()
    c = LLMClient(ModelConfig(name="stub", litellm_model="openai/stub", api_base=url,
                              **{"max_concurrency": 8, **model}), rt, meter)

    async def go():
        return await asyncio.gather(*(c.complete([{"role": "user", "content": f"question {i}"}], step="s")
                                      for i in range(n)))

    start = time.perf_counter()
    asyncio.run(go())
    return meter, time.perf_counter() - start


@pytest.mark.slow
def test_rpm_pacing_keeps_429s_near_zero(tmp_path: Path) -> None:
    n = 16
    # a provider that states nothing but retry-after: until its refusals teach the pace, the burst meets them
    with StubServer(rpm=240, latency_ms=50, limit_headers="retry-after") as stub:  # 4 a second, one-second windows
        meter, seconds = _run(stub.url, tmp_path, n)
        unpaced = stub.stats()["rate_limited"]
    with StubServer(rpm=240, latency_ms=50, limit_headers="retry-after") as stub:
        meter, seconds = _run(stub.url, tmp_path, n, pool=PoolConfig(rpm=240))
        paced = stub.stats()["rate_limited"]
    assert unpaced >= 2
    assert paced <= 1 and meter.as_dict()["s"]["calls"] == n
    assert seconds >= (n - 1) / 4 * 0.9  # it did wait for the windows
    assert "waiting on rate limits" in usage_line(usage_metrics(meter))


@pytest.mark.slow
def test_the_limits_a_provider_states_pace_the_pool(tmp_path: Path) -> None:
    """Adaptation alone (no rpm configured): the x-ratelimit-limit-* headers OpenAI sends with every reply pace
    the rest, before the burst of the first calls meets a closed window."""
    n = 24
    with StubServer(rpm=300, latency_ms=50) as stub:
        meter, seconds = _run(stub.url, tmp_path, n)
        st = stub.stats()
    assert st["total_completed"] == n
    assert st["rate_limited"] <= 4  # at most the slow start's first calls (4 in flight into a 5-request window)
    from cupid_exp.llm.pools import _POOLS

    (pool,) = _POOLS.values()
    assert pool.pace.pacer.rpm == 300 and pool.pace.told == (300.0, None)


def test_a_429_while_pacing_slows_every_process_of_the_ledger(tmp_path: Path) -> None:
    ledger = tmp_path / "rate_limits" / "endpoint.json"
    first, second = Pacer(60, None, ledger), Pacer(60, None, ledger)  # a request a second: slack for a busy CPU
    first.rate_limited()
    first.rate_limited()  # within the cooldown: one cut
    second.reserve(1)
    assert second.scale == pytest.approx(0.9)
    assert second.reserve(1) == pytest.approx(1 / (PACE_MARGIN * 0.9), abs=0.2)
    for _ in range(100):
        first.succeeded()
    assert first.reserve(1) > 0 and first.scale == 1.0


def test_a_call_first_in_line_takes_the_next_free_slot_before_those_that_waited_longer() -> None:
    """A persona's sessions (its critical path) are not queued behind the dialogues that fill the slots meanwhile."""
    from cupid_exp.llm.limits import first_in_line

    order: list[str] = []

    async def run() -> None:
        limit = AdaptiveLimit(1)
        limit.slow_start, limit.limit = False, 1.0
        await limit.acquire()  # the one slot is taken

        async def call(name: str) -> None:
            await limit.acquire()
            order.append(name)
            await asyncio.sleep(0)
            limit.release()

        async def urgent() -> None:
            with first_in_line():
                await call("session")

        waiting = [asyncio.ensure_future(call("dialogue 1")), asyncio.ensure_future(call("dialogue 2"))]
        await asyncio.sleep(0)
        waiting.append(asyncio.ensure_future(urgent()))
        await asyncio.sleep(0)
        limit.release()
        await asyncio.gather(*waiting)

    asyncio.run(run())
    assert order == ["session", "dialogue 1", "dialogue 2"]


def test_work_a_critical_path_starts_but_does_not_wait_for_waits_its_turn() -> None:
    """A persona's checklists, started from its chain (first in line), queue behind the calls already waiting."""
    from cupid_exp.llm.limits import first_in_line, in_turn

    order: list[str] = []

    async def run() -> None:
        limit = AdaptiveLimit(1)
        limit.slow_start, limit.limit = False, 1.0
        await limit.acquire()

        async def call(name: str) -> None:
            await limit.acquire()
            order.append(name)
            await asyncio.sleep(0)
            limit.release()

        waiting = [asyncio.ensure_future(call("dialogue"))]
        await asyncio.sleep(0)
        with first_in_line():
            with in_turn():
                waiting.append(asyncio.ensure_future(call("checklist")))
            waiting.append(asyncio.ensure_future(call("factor")))
        await asyncio.sleep(0)
        limit.release()
        await asyncio.gather(*waiting)

    asyncio.run(run())
    assert order == ["factor", "dialogue", "checklist"]
