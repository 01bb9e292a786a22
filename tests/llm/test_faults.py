"""Provider faults against the stub server: 429/500/503, slow and malformed responses, retry-after.

The CLI test checks the accounting end to end: every request the stub received is either a
completed call, a retry, or the first attempt of a call that gave up — and those numbers are the
ones logged to MLflow.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from helpers.cli_runner import cli_command, job_dirs, metrics_of, read_jsonl, run_cli

from cupid_exp.config import CallsConfig, ModelConfig
from cupid_exp.llm.client import LLMClient, ProviderError, configure_litellm
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.stub_llm_server import StubServer

KINDS = {"rate_limit", "provider", "timeout", "context_length", "auth", "unparseable"}


def client(url: str, tmp_path: Path, **runtime) -> tuple[LLMClient, UsageMeter]:
    rt = CallsConfig(cache_dir=str(tmp_path / "cache"), cache=False,
                       **{"num_retries": 3, "timeout": 10, **runtime})
    configure_litellm(rt)
    meter = UsageMeter()
    return LLMClient(ModelConfig(name="stub", litellm_model="openai/stub", api_base=url), rt, meter), meter


def ask(c: LLMClient, text: str = "hello"):
    return asyncio.run(c.complete([{"role": "user", "content": text}], step="s"))


@pytest.mark.slow
def test_retry_after_is_honoured(tmp_path: Path) -> None:
    # every prompt's first attempt is a 429 asking for 2 s; litellm's own backoff would wait 0.5-1.25 s
    with StubServer(fail_first=1, fail_first_kind="429", retry_after=2) as stub:
        c, meter = client(stub.url, tmp_path)
        start = time.perf_counter()
        out = ask(c)
        elapsed = time.perf_counter() - start
    assert out.text and out.rate_limited == 1 and out.retries == 0  # a 429 is not one of num_retries
    assert stub.stats()["total_received"] == 2
    assert 2.0 <= elapsed < 6.0
    assert meter.as_dict()["s"]["rate_limited"] == 1 and out.limit_wait_s >= 2.0


@pytest.mark.parametrize("fault,kind", [("rate_500", "provider"), ("rate_malformed", "provider")])
def test_give_up_counts_its_retries(tmp_path: Path, fault: str, kind: str) -> None:
    with StubServer(**{fault: 1.0}, retry_after=0) as stub:
        c, meter = client(stub.url, tmp_path, num_retries=1)
        with pytest.raises(ProviderError) as err:
            ask(c)
    assert err.value.kind == kind
    assert stub.stats()["total_received"] == 2  # the first attempt and 1 retry
    counts = meter.as_dict()["s"]
    assert counts[f"failed_{kind}"] == 1 and counts["retries"] == 1 and counts.get("calls", 0) == 0


@pytest.mark.slow
def test_slow_response_times_out_and_is_retried(tmp_path: Path) -> None:
    with StubServer(fail_first=1, fail_first_kind="slow", slow_s=3) as stub:
        c, meter = client(stub.url, tmp_path, timeout=1)
        start = time.perf_counter()
        out = ask(c)
    assert out.text and out.retries == 1 and time.perf_counter() - start >= 1
    with StubServer(rate_slow=1.0, slow_s=3) as stub:
        c, meter = client(stub.url, tmp_path, timeout=1, num_retries=1)
        with pytest.raises(ProviderError) as err:
            ask(c)
    assert err.value.kind == "timeout"


def test_a_422_rejection_fails_the_step_instead_of_crashing(tmp_path: Path) -> None:
    """litellm (drop_params=True) returns None after a second HTTP 422; the client must raise, not crash."""
    with StubServer(context_error="tgi") as stub:
        c, meter = client(stub.url, tmp_path)
        with pytest.raises(ProviderError) as err:
            ask(c)
    assert err.value.kind == "provider" and "no completion" in str(err.value)
    assert meter.as_dict()["s"]["failed_provider"] == 1


@pytest.mark.slow
def test_run_survives_provider_faults_and_counts_them_in_mlflow(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    n = 12
    data = write_dataset(tmp_path / "data.jsonl", n)
    faults = dict(rate_429=0.1, rate_500=0.1, rate_503=0.1, rate_slow=0.04, rate_malformed=0.06, slow_s=3.0,
                  retry_after=1, giveup_match="(variant 3)", seed=11)  # instance 3's inference always fails
    root = tmp_path / "out"
    with StubServer(**faults) as stub:
        proc = run_cli(cli_command(stub.url, root, "calls.timeout=2", "calls.num_retries=3",
                                   "runtime.max_failed_fraction=1", cache_dir=tmp_path / "cache", data=data),
                       timeout=240)
        st = stub.stats()
    faults_seen = {kind for per_step in st["faults"].values() for kind in per_step}
    assert {"429", "500", "503", "slow", "malformed"} <= faults_seen

    (job,) = job_dirs(root)
    records = read_jsonl(job / "instances.jsonl")
    rows = [r for r in read_jsonl(data)]
    assert [r["key"] for r in records] == [f"{r['persona_id']}/{r['instance_type']}" for r in rows]  # none lost
    for r in records:
        if r["errors"]:
            assert r.get("f1") is None
            assert all(e["kind"] in KINDS and e["step"] and e["message"] for e in r["errors"])
        else:
            assert 0 <= r["f1"] <= 1
    failed = [r for r in records if r["errors"]]
    assert any(r["key"].startswith("103+") and r["errors"][0]["step"] == "infer" for r in failed)

    metrics = metrics_of(job)
    gave_up = sum(len(r["errors"]) for r in records)
    assert metrics["calls/failed"] == gave_up >= 1
    assert metrics["calls/retries"] >= 1
    # every request the stub saw: a completed call, a retry (after a 429 too), or the first attempt of a failed call
    sent = metrics["calls/total"]  # provider answers only: a cache hit is counted apart (calls/cache_hits)
    assert st["total_received"] == (sent + metrics["calls/retries"] + metrics["calls/rate_limited"]
                                    + metrics["calls/failed"]) == metrics["calls/requests"]
    assert metrics["calls/rate_limited"] >= 1
    assert st["total_completed"] == sent
    errors = {}
    for r in records:
        for e in r["errors"]:
            key = f"errors/{e['step']}/{e['kind']}"
            errors[key] = errors.get(key, 0) + 1
    assert {k: v for k, v in metrics.items() if k.count("/") == 2 and k.startswith("errors/")} == errors
    assert f"{n - len(failed)} scored, {len(failed)} failed" in proc.stdout

    # the same numbers are in the MLflow run
    mlflow_client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    (run,) = mlflow_client.search_runs([mlflow_client.get_experiment_by_name("cupid").experiment_id])
    logged = run.data.metrics
    for key in ("calls/retries", "calls/rate_limited", "calls/failed", "calls/requests", "calls/total", *errors):
        assert logged[key] == metrics[key], key
    assert run.info.status == "FINISHED"
