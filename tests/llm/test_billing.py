"""Spend counted as the provider bills, whatever the reply carries, against the stub's own count of what it billed:
a reply without usage, a request lost after it was sent (each attempt its own reservation), a request a kill cut
(in the usage ledger before it is sent), a cache hit (billed nothing, counted apart), a 200 without a
completion (retried like a 5xx), identical requests sharing one batch row; and the Batch API's refusals meaning
what they mean live (a fatal refusal, a rate limit beyond patience, the enqueued-token limit)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import litellm
import pytest

from cupid_exp.config import CallsConfig, ModelConfig, ModelInfo
from cupid_exp.durability.ledger import UsageLedger
from cupid_exp.errors import Terminated
from cupid_exp.llm.billing import lost_after_sending
from cupid_exp.llm.budget import Account, Budget, BudgetExceeded, Prices, worst_case_tokens, worst_case_usd
from cupid_exp.llm.client import LLMClient, ProviderError, configure_litellm
from cupid_exp.llm.pools import forget_pools
from cupid_exp.llm.retry import FatalProviderError, RetryLater
from cupid_exp.llm.usage import UsageMeter, requests_sent, usage_line, usage_metrics
from cupid_exp.testing.batch_api import BatchQueueConfig
from cupid_exp.testing.stub_llm_server import StubServer

IN, OUT, MAX_TOKENS = 1e-6, 4e-6, 100
PRICES = Prices(IN, OUT)
HELLO = [{"role": "user", "content": "Say hello to the billing department, please."}]


def client(url: str, tmp_path: Path, cap: float | None = None, **runtime) -> tuple[LLMClient, UsageMeter]:
    forget_pools()
    rt = CallsConfig(cache_dir=str(tmp_path / "cache"), **{"cache": False, "num_retries": 3, "timeout": 10,
                                                              **runtime})
    configure_litellm(rt)
    model = ModelConfig(name="priced", litellm_model="openai/stub", api_base=url, params={"max_tokens": MAX_TOKENS},
                        model_info=ModelInfo(input_cost_per_token=IN, output_cost_per_token=OUT))
    meter = UsageMeter()
    budget = Budget([Account(str(tmp_path / "budget.json"), cap, "calls.max_cost_usd")]) if cap else None
    return LLMClient(model, rt, meter, budget), meter


def ledger(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "budget.json").read_text())


def billed_usd(stats: dict) -> float:
    billed = stats["billed"]
    return billed["prompt_tokens"] * IN + billed["completion_tokens"] * OUT


def settled(stub: StubServer, timeout: float = 10.0) -> dict:
    """The stub's counters once it has finished every request (a slow one is billed after its client left)."""
    deadline = time.monotonic() + timeout
    while stub.stats()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return stub.stats()


def test_a_reply_without_usage_is_costed_from_a_local_count_and_the_budget_counts_it(tmp_path: Path) -> None:
    with StubServer(omit_usage=True) as stub:
        c, meter = client(stub.url, tmp_path, cap=1.0)
        done = asyncio.run(c.complete(HELLO, step="s"))
        stats = stub.stats()
    assert stats["billed"]["requests"] == 1 and stats["billed"]["prompt_tokens"] > 0  # the stub billed, said nothing
    assert done.usage_estimated and done.prompt_tokens == litellm.token_counter(model="openai/stub", messages=HELLO)
    assert (done.prompt_tokens, done.completion_tokens) == (stats["billed"]["prompt_tokens"],
                                                            stats["billed"]["completion_tokens"])
    assert done.cost_usd == pytest.approx(billed_usd(stats)) and done.cost_usd > 0
    assert ledger(tmp_path)["spent"] == pytest.approx(done.cost_usd)
    metrics = usage_metrics(meter)
    assert metrics["tokens/estimated_calls"] == 1 and metrics["cost/usd"] == pytest.approx(done.cost_usd)
    assert "out (1 calls' usage estimated); cost: $" in usage_line(metrics)


def test_each_request_lost_after_sending_is_charged_its_worst_case_and_a_retry_that_cannot_fit_is_not_sent(
        tmp_path: Path) -> None:
    worst = worst_case_usd(PRICES, HELLO, {"max_tokens": MAX_TOKENS})
    with StubServer(rate_slow=1.0, slow_s=1.2) as stub:  # every reply after the client's timeout: billed all the same
        c, meter = client(stub.url, tmp_path, cap=2.5 * worst, timeout=0.4, num_retries=5)
        with pytest.raises(BudgetExceeded):
            asyncio.run(c.complete(HELLO, step="s"))
        stats = settled(stub)
    assert stats["total_received"] == 2 and stats["faults"]["unknown"]["slow"] == 2  # the third did not fit
    assert stats["billed"]["requests"] == 2
    state = ledger(tmp_path)
    assert state["spent"] == pytest.approx(2 * worst) and state["reservations"] == {}
    assert billed_usd(stats) <= state["spent"] <= 2.5 * worst
    counts = meter.as_dict()["s"]
    assert requests_sent(counts) == 2 and counts["charged_requests"] == 2 and counts["not_sent_budget"] == 1
    assert counts["cost_usd"] == pytest.approx(state["spent"])


def test_a_connection_lost_after_sending_is_charged_and_one_never_made_is_not(tmp_path: Path) -> None:
    import threading

    worst = worst_case_usd(PRICES, HELLO, {"max_tokens": MAX_TOKENS})
    with StubServer() as stub:
        stub.hold_after(0)  # the request is received, then its connection closed without a reply
        threading.Timer(0.5, stub.release).start()
        c, meter = client(stub.url, tmp_path, cap=1.0, num_retries=0)
        with pytest.raises(ProviderError):
            asyncio.run(c.complete(HELLO, step="s"))
        assert stub.stats()["total_received"] == 1 and stub.stats()["total_completed"] == 0
    assert ledger(tmp_path)["spent"] == pytest.approx(worst)
    assert meter.as_dict()["s"]["charged_requests"] == 1

    c, meter = client("http://127.0.0.1:9/v1", tmp_path / "nowhere", cap=1.0, num_retries=5)
    with pytest.raises(FatalProviderError):  # refused three times, never accepted: unreachable
        asyncio.run(c.complete(HELLO, step="s"))
    assert ledger(tmp_path / "nowhere")["spent"] == 0.0 and "charged_requests" not in meter.as_dict()["s"]



def test_a_request_cancelled_in_flight_is_charged_its_worst_case(tmp_path: Path) -> None:
    """A job stopped while a request is on its way (SIGTERM, a dead sweep launcher) cancels the call; the provider
    answers and bills it all the same, so the budget keeps its worst case."""
    worst = worst_case_usd(PRICES, HELLO, {"max_tokens": MAX_TOKENS})

    async def stopped_while_in_flight(c: LLMClient, stub: StubServer) -> None:
        call = asyncio.ensure_future(c.complete(HELLO, step="s"))
        while not stub.stats()["total_received"]:
            await asyncio.sleep(0.02)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    with StubServer(rate_slow=1.0, slow_s=0.6) as stub:
        c, meter = client(stub.url, tmp_path, cap=1.0)
        asyncio.run(stopped_while_in_flight(c, stub))
        stats = settled(stub)
    assert stats["total_received"] == 1 and stats["billed"]["requests"] == 1  # the provider billed the cancelled one
    state = ledger(tmp_path)
    assert state["reservations"] == {} and state["spent"] == pytest.approx(worst)
    assert billed_usd(stats) <= state["spent"]
    assert meter.as_dict()["s"]["charged_requests"] == 1
    m = usage_metrics(meter)  # its tokens too, at their worst case: never fewer than the provider billed
    assert m["tokens/prompt"] >= stats["billed"]["prompt_tokens"] > 0 and m["cost/usd"] == pytest.approx(worst)
    assert m["tokens/completion"] >= stats["billed"]["completion_tokens"] and m["calls/unsettled"] == 0



@pytest.mark.parametrize("stop", [Terminated(signal.SIGTERM), KeyboardInterrupt(), asyncio.CancelledError()],
                         ids=["sigterm", "ctrl_c", "cancelled"])
def test_a_request_a_stop_interrupts_in_flight_may_have_been_billed(stop: BaseException) -> None:
    """A stop signal's exception can be raised inside the request's own frames (the handler runs between any two
    bytecodes): the request may be out, so it is charged its worst case like a cancellation (the matrix's SIGTERM
    cell once reported less than the stub billed)."""
    assert lost_after_sending(stop)
    assert not lost_after_sending(ValueError("a bug of ours is not a request in flight"))


def test_a_request_is_in_the_usage_ledger_before_it_is_sent_and_one_a_kill_cut_is_charged_its_worst_case(
        tmp_path: Path) -> None:
    """The usage ledger as a SIGKILL leaves it while a request is on its way (a copy taken then: nothing runs after
    a SIGKILL) holds the request in flight; read back, it is charged its worst case, never less than the provider
    billed for it. The ledger as the call left it holds the reply as billed, the request settled."""
    async def copied_while_in_flight(c: LLMClient, stub: StubServer, usage: UsageLedger) -> bytes:
        call = asyncio.ensure_future(c.complete(HELLO, step="s"))
        while not stub.stats()["in_flight"]:
            await asyncio.sleep(0.02)
        cut = usage.path.read_bytes()
        await call
        return cut

    usage = UsageLedger(tmp_path / "usage.jsonl")
    prompt, reply = worst_case_tokens(HELLO, {"max_tokens": MAX_TOKENS}, None)
    with StubServer(latency_ms=300) as stub:
        c, meter = client(stub.url, tmp_path)
        meter.sink = usage.append
        cut = asyncio.run(copied_while_in_flight(c, stub, usage))
        stats = settled(stub)
    assert stats["billed"]["requests"] == 1
    (tmp_path / "killed.jsonl").write_bytes(cut)
    killed = usage_metrics(UsageLedger(tmp_path / "killed.jsonl").load())
    assert killed["calls/requests"] == killed["calls/unsettled"] == killed["cost/charged_requests"] == 1
    assert killed["calls/total"] == 0 and killed["cost/usd"] == pytest.approx(prompt * IN + reply * OUT)
    assert (killed["tokens/prompt"], killed["tokens/completion"]) == (prompt, reply)
    assert killed["cost/usd"] >= billed_usd(stats) and killed["tokens/prompt"] >= stats["billed"]["prompt_tokens"]
    whole = usage_metrics(UsageLedger(usage.path).load())
    assert whole["calls/requests"] == whole["calls/total"] == 1 and whole["calls/unsettled"] == 0
    assert whole["cost/usd"] == pytest.approx(billed_usd(stats)) and whole["tokens/prompt"] == stats["billed"][
        "prompt_tokens"]
    # the meter's usage, as the ledger replays it (a pool's pacing counts are the meter's own, never in the ledger)
    assert whole == {k: v for k, v in usage_metrics(meter).items() if not k.startswith("pools/")}


def test_a_cache_hit_is_counted_apart_never_as_a_call_tokens_or_cost(tmp_path: Path) -> None:
    with StubServer() as stub:
        c, meter = client(stub.url, tmp_path, cache=True)
        fresh = asyncio.run(c.complete(HELLO, step="s"))
        hit = asyncio.run(c.complete(HELLO, step="s"))
        stats = stub.stats()
    assert hit.cached and not fresh.cached and stats["billed"]["requests"] == 1
    m = usage_metrics(meter)
    assert (m["calls/total"], m["calls/s"], m["calls/cache_hits"], m["calls/requests"]) == (1, 1, 1, 1)
    assert (m["tokens/prompt"], m["tokens/completion"]) == (stats["billed"]["prompt_tokens"],
                                                            stats["billed"]["completion_tokens"])
    assert m["cost/usd"] == pytest.approx(billed_usd(stats))
    assert usage_line(m).startswith("calls: 2 ok (1 cached), 0 failed; requests sent: 1 ")


@pytest.mark.parametrize("kind", ["empty_choices", "content_null"])
def test_a_reply_without_a_completion_is_retried_like_a_5xx_then_fails_as_provider(tmp_path: Path, kind: str) -> None:
    with StubServer(fail_first=1, fail_first_kind=kind) as stub:
        c, meter = client(stub.url, tmp_path, cap=1.0, cache=True)
        done = asyncio.run(c.complete(HELLO, step="s"))
        again = asyncio.run(c.complete(HELLO, step="s"))  # the empty reply was never cached: the good one was
        stats = stub.stats()
    assert stats["faults"]["unknown"][kind] == 1 and stats["total_received"] == 2
    assert done.text.startswith("Stub reply") and done.retries == 1 and again.cached and again.text == done.text
    assert ledger(tmp_path)["spent"] == pytest.approx(billed_usd(stats))  # the empty reply's prompt too
    assert done.charged_requests == 1 and done.charged_usd > 0

    with StubServer(**{f"rate_{kind}": 1.0}) as stub:
        c, meter = client(stub.url, tmp_path / "again", num_retries=2)
        with pytest.raises(ProviderError) as failed:
            asyncio.run(c.complete(HELLO, step="s"))
    assert failed.value.kind == "provider" and "no completion" in str(failed.value)
    assert stub.stats()["total_received"] == 3
    assert meter.as_dict()["s"]["failed_provider"] == 1 and meter.as_dict()["s"]["retries"] == 2


BATCH = {"batch": True, "batch_delay_s": 0.1, "batch_poll_s": 0.1}


def ask_all(c: LLMClient, prompts: list[str]) -> list:
    async def run() -> list:
        calls = [c.complete([{"role": "user", "content": p}], step="s") for p in prompts]
        return await asyncio.gather(*calls, return_exceptions=True)
    return asyncio.run(run())


def test_identical_requests_sharing_a_batch_row_are_costed_once_and_rows_without_usage_counted(tmp_path: Path) -> None:
    with StubServer(omit_usage=True, batch=BatchQueueConfig(complete_after_s=0.1)) as stub:
        c, meter = client(stub.url, tmp_path, cap=1.0, **BATCH)
        out = ask_all(c, ["same question", "same question", "another question"])
        stats = stub.stats()
    assert all(not isinstance(o, BaseException) for o in out), out
    assert stub.batches.rows_accepted == 2 and stats["billed"]["requests"] == 2  # one row for the two
    assert sorted(o.cached for o in out) == [False, False, True]
    m = usage_metrics(meter)
    assert m["cost/usd"] == pytest.approx(billed_usd(stats)) == pytest.approx(ledger(tmp_path)["spent"])
    assert m["cost/usd"] > 0 and m["tokens/estimated_calls"] == 2  # the rows carried no usage: counted here
    assert meter.batches.rows_shared == 1


def test_a_batch_row_answered_in_an_unreadable_line_is_charged_its_worst_case_once(tmp_path: Path) -> None:
    """Each row's first result line is cut (billed, unreadable): sent again, and its caller (one for the two
    identical requests) charged its worst case at batch prices, in the metrics and on the budget."""
    with StubServer(batch=BatchQueueConfig(complete_after_s=0.1, garble_rows=1.0)) as stub:
        c, meter = client(stub.url, tmp_path, cap=1.0, **BATCH)
        out = ask_all(c, ["same question", "same question", "another question"])
        stats = stub.stats()
    assert all(not isinstance(o, BaseException) for o in out), out
    assert stub.batches.rows_garbled == 2 and stats["billed"]["requests"] == 4  # each row billed twice
    worst = sum(worst_case_usd(Prices(IN, OUT), [{"role": "user", "content": p}], {"max_tokens": MAX_TOKENS})
                for p in ("same question", "another question"))
    m = usage_metrics(meter)
    assert m["cost/charged_requests"] == 2 and meter.batches.rows_unreadable == 2
    assert m["cost/usd"] == pytest.approx(billed_usd(stats) / 2 + worst) == pytest.approx(ledger(tmp_path)["spent"])
    assert m["cost/usd"] >= billed_usd(stats)


@pytest.mark.parametrize("refusal,stop", [("401", FatalProviderError), ("insufficient_quota", FatalProviderError),
                                          ("daily", RetryLater)])
def test_a_refused_batch_upload_stops_the_job_as_a_live_refusal_does(tmp_path: Path, refusal: str, stop: type) -> None:
    with StubServer(batch=BatchQueueConfig(refuse_upload=refusal)) as stub:
        c, meter = client(stub.url, tmp_path, **BATCH)
        out = ask_all(c, ["one", "two", "three"])
    assert stub.batches.upload_refusals == 1 and stub.batches.submissions == 0  # refused once, never retried
    assert all(type(o) is stop for o in out), out
    assert not isinstance(out[0], ProviderError)  # no instance failure: the job stops (exit 2, or 75 for later)
    if refusal == "daily":
        assert "requests per day" in str(out[0]) and "wait 3600 s" in str(out[0])
    else:
        assert refusal in str(out[0])


def test_a_batch_over_the_enqueued_token_limit_is_held_and_sent_again_under_it(tmp_path: Path) -> None:
    prompts = [f"question {i}: " + "tell me about the weather in some detail. " * 20 for i in range(6)]
    row = len(prompts[0]) // 4  # the stub's tokens per row (characters / 4)
    with StubServer(batch=BatchQueueConfig(complete_after_s=0.3, enqueued_token_limit=int(2.5 * row))) as stub:
        c, meter = client(stub.url, tmp_path, **BATCH)
        out = ask_all(c, prompts)
    assert all(not isinstance(o, BaseException) for o in out), out  # no row failed
    assert stub.batches.token_limit_rejections == 1  # the first batch (all six); then batches of two
    assert stub.batches.rows_accepted == 6 and meter.batches.held_token_limit == 1
    assert all(b.tokens <= 2.5 * row for b in stub.batches.batches.values() if b.rejection is None)
    assert c._batcher.queue.limit == int(2.5 * row)  # parsed from "Limit: N enqueued tokens"


def test_a_token_limit_that_never_admits_a_row_stops_the_job_for_later(tmp_path: Path) -> None:
    with StubServer(batch=BatchQueueConfig(complete_after_s=0.1, enqueued_token_limit=1)) as stub:
        c, meter = client(stub.url, tmp_path, rate_limit_patience_s=0.5, **BATCH)
        out = ask_all(c, ["a question that never fits", "another"])
    assert stub.batches.token_limit_rejections >= 2 and stub.batches.rows_accepted == 0
    assert all(isinstance(o, RetryLater) for o in out), out
    assert "Limit: 1 enqueued tokens" in str(out[0]) and "rate_limit_patience_s=0.5" in str(out[0])
