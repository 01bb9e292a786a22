"""Usage counted in another process (a ``runtime.workers`` worker) reaches the job's meter exactly once."""

from __future__ import annotations

from cupid_exp.llm.usage import Completion, UsageMeter, usage_metrics


def test_what_a_worker_counted_since_its_last_report_merges_into_the_job_meter_once() -> None:
    worker, job, sent = UsageMeter(), UsageMeter(), {}
    job.add("infer", Completion(text="a", prompt_tokens=10, completion_tokens=2, cost_usd=0.5))
    worker.add("infer", Completion(text="b", prompt_tokens=7, completion_tokens=1, cost_usd=0.25))
    worker.fail("judge", "rate_limit", retries=2)
    job.merge(worker.since(sent))
    assert worker.since(sent) == {}  # nothing new: nothing sent twice
    worker.add("infer", Completion(text="c", prompt_tokens=3, completion_tokens=1, cost_usd=None, cached=True))
    job.merge(worker.since(sent))
    totals = job.totals()
    assert totals["calls"] == 2 and totals["prompt_tokens"] == 17 and totals["cost_usd"] == 0.75  # no cache hit
    assert totals["cache_hits"] == 1 and totals["unpriced_calls"] == 1
    metrics = usage_metrics(job)
    assert metrics["calls/failed"] == 1 and metrics["calls/retries"] == 2
    assert metrics["calls/requests"] == 2 + 1 + 2  # fresh successes, the failed call, its retries
