"""A resumed job continues its run: SIGKILLed attempts (mid-job and while logging) are taken over by the next
attempt, which ends the same run FINISHED with the whole job's calls, tokens and cost, labelled by attempt."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from helpers.cli_runner import job_dirs, metrics_of, read_jsonl, run_job
from helpers.tracking_runs import (
    held_job,
    history,
    job_command,
    job_runs,
    only_run,
    start,
    store_uri,
    traces_of,
    wait_for,
)
from mlflow.tracking import MlflowClient

from cupid_exp.durability.attempts import earlier_attempt_metrics, earlier_usage, run_key, whole_job_metrics
from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.inprocess import InProcessModel
from cupid_exp.testing.stub_llm_server import StubServer

N = 10
CALLS = 4 * N


def _journalled(root: Path) -> int:
    return sum(len(read_jsonl(p)) for p in (root / "journal").glob("*.jsonl"))


def _sigkill(proc, log: Path) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL, log.read_text()[-2000:]


@pytest.mark.slow
def test_killed_attempts_resume_one_run_that_reports_the_whole_job(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    with StubServer(latency_ms=5) as stub:
        clean_root = tmp_path / "clean"
        run_job(job_command(stub.url, clean_root, data))  # the reference: no process of its own needed
        clean = only_run(store_uri(clean_root)).data.metrics
        assert clean["calls/total"] == CALLS and clean["cost/usd"] > 0
        stub.reset()  # the gate counts completed responses from here

        root = tmp_path / "out"
        uri = store_uri(root)
        cmd = job_command(stub.url, root, data, "calls.num_retries=0")
        # attempt 1: SIGKILL mid-job, some instances journalled
        log1 = tmp_path / "attempt1.log"
        # instances progress side by side: most finish in the last quarter of the calls
        with held_job(stub, cmd, log1, after=CALLS - 6) as proc:
            wait_for(lambda: _journalled(root) and only_run(uri), 30, "a journalled instance and the run")
            time.sleep(1.5)  # the replies sent before the gate closed are read (their requests are paid)
            _sigkill(proc, log1)
        first = only_run(uri)
        assert first.info.status == "RUNNING" and 0 < _journalled(root) < N  # nothing can end a run on SIGKILL...
        # attempt 2: SIGKILL of the job and its MLflow worker (the process group, as a scheduler kills a job) while
        # they log its results: the store is locked from its first model call (its run is open by then, and
        # slower replies leave the time) until the table is printed (MLflow waits up to 20 s on a locked SQLite)
        log2 = tmp_path / "attempt2.log"
        stub.config.wire.latency_ms, received = 300, stub.stats()["total_received"]
        proc = start(cmd, log2, new_session=True)
        lock = sqlite3.connect(root / "mlflow.db", timeout=60, isolation_level=None)
        try:
            wait_for(lambda: stub.stats()["total_received"] > received, 120, "attempt 2's first call")
            lock.execute("BEGIN EXCLUSIVE")
            wait_for(lambda: "| MLflow run " in log2.read_text(), 60, "the printed table")
            os.killpg(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL, log2.read_text()[-2000:]
        finally:
            lock.close()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            stub.config.wire.latency_ms = 5
        assert only_run(uri).info.status == "RUNNING"
        # attempt 3: nothing left to call; it ends the run
        before = stub.stats()["total_received"]
        final = run_job(cmd)
        assert stub.stats()["total_received"] == before and "resuming: 10 of 10" in final.stdout + final.stderr

    run = only_run(uri)  # ...but the next attempt takes the run over: still one run for the job
    assert run.info.run_id == first.info.run_id and run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["cupid.attempt"] == "3" and tags["cupid.attempt.3"].startswith("FINISHED with 10 of 10")
    assert "died" in tags["cupid.attempt.1"] and "died" in tags["cupid.attempt.2"]
    m = run.data.metrics
    # the whole job: every request the stub answered, in any attempt, is in the spend (attempt 1's unfinished
    # instances included: attempt 2 found their answered calls in the cache, at no cost), and those the kill left
    # unanswered (the stub held them) at their worst case: the job could not know they would not be billed
    paid = stub.stats()
    assert m["calls/requests"] >= paid["total_completed"] + 1 and m["calls/unsettled"] >= 1
    assert m["cost/usd"] > paid["tokens"]["prompt_tokens"] * 2.5e-06 + paid["tokens"]["completion_tokens"] * 1e-05
    # a cache hit is not a call: the calls counted are replies the stub sent, cache hits apart
    assert m["calls/total"] <= paid["total_completed"] and m["calls/total"] + m["calls/cache_hits"] >= CALLS
    assert m["calls/total/this_attempt"] == 0 and m["calls/total/earlier_attempts"] == m["calls/total"]
    assert m["cost/usd/this_attempt"] == 0 and m["cost/usd"] == m["cost/usd/earlier_attempts"] > 0
    # every usage metric the clean run has, per step included, though this attempt made no call
    usage_keys = {k for k in clean if k.startswith(("calls/", "tokens/", "cost/")) and "/this_attempt" not in k}
    assert usage_keys <= set(m), sorted(usage_keys - set(m))
    job = job_dirs(root)[-1]  # attempt 3's folder (attempt 2 wrote its files before it was killed)
    records = read_jsonl(job / "instances.jsonl")
    saved = metrics_of(job)  # the attempt's own folder: this attempt's usage, the earlier attempts' beside it
    assert saved["calls/total"] == 0 and saved["calls/total/earlier_attempts"] == m["calls/total"]
    # at most one trace per instance across the attempts (a SIGKILL loses the traces not yet exported)
    keys = [t.info.tags["cupid.key"] for t in traces_of(uri, run)]
    assert len(keys) == len(set(keys)) and set(keys) <= {r["key"] for r in records}
    # progress continued to the end
    steps = [s for s, _ in history(MlflowClient(uri), run.info.run_id, "progress/instances_done")]
    assert steps[-1] == N and len(job_runs(uri)) == 1


def test_the_run_key_separates_what_reports_differently(tmp_path: Path) -> None:
    from types import SimpleNamespace

    rt = SimpleNamespace(failure_policy="exclude", max_failed_fraction=0.1, retry_failed=False)
    key = run_key("abc", rt, tmp_path)
    assert key == run_key("abc", SimpleNamespace(**vars(rt)), tmp_path / "." )
    assert key != run_key("abd", rt, tmp_path) and key != run_key("abc", rt, tmp_path / "other")
    assert key != run_key("abc", SimpleNamespace(**{**vars(rt), "failure_policy": "zero"}), tmp_path)


def test_earlier_usage_comes_from_the_journalled_records() -> None:
    records = [{"usage": {"infer": {"calls": 1, "prompt_tokens": 10, "completion_tokens": 2, "cost_usd": 0.5,
                                    "cache_hits": 0}}},
               {"usage": {"infer": {"calls": 2, "prompt_tokens": 5, "completion_tokens": 1}}}]  # an old journal line
    earlier = earlier_usage(records)
    assert earlier["calls"] == 3 and earlier["prompt_tokens"] == 15 and earlier["cost_usd"] == 0.5
    assert earlier["unpriced_instances"] == 1
    summary = {"calls/total": 4.0, "cost/usd": 0.25, **earlier_attempt_metrics(earlier)}
    assert summary["calls/total/earlier_attempts"] == 3 and summary["cost/usd/earlier_unpriced_instances"] == 1
    m = whole_job_metrics(summary)
    assert m["calls/total"] == 7 and m["calls/total/this_attempt"] == 4 and m["cost/usd"] == 0.75


def test_the_same_data_spelt_two_ways_is_one_job(tmp_path: Path) -> None:
    """``data.path`` relative or absolute: one identity, so the second command resumes the first's journal and finds
    the job done: its MLflow run, which holds the results, is the job's and is left as it was (its cost the first
    attempt's, not a second attempt's $0)."""
    data = write_dataset(tmp_path / "data.jsonl", 3)
    root = tmp_path / "out"
    with InProcessModel() as stub:
        first = run_job(job_command(stub, root, data))
        spent = only_run(store_uri(root)).data.metrics["cost/usd"]
        assert spent > 0 and "resuming" not in first.stdout + first.stderr
        relative = os.path.relpath(data)  # run_job runs the command in this process's folder
        assert not Path(relative).is_absolute()
        before = stub.stats()["total_received"]
        again = run_job(job_command(stub, root, Path(relative), cache_dir=tmp_path / "cold"))
        assert stub.stats()["total_received"] == before and "resuming: 3 of 3" in again.stdout + again.stderr
    run = only_run(store_uri(root))  # the same run, untouched (tests/tracking/test_finished_runs.py)
    assert f"MLflow run {run.info.run_id} (FINISHED): left as it was" in again.stdout + again.stderr
    assert run.data.tags["cupid.attempt"] == "1" and run.data.params["data.path"] == str(data)
    assert run.data.metrics["cost/usd"] == pytest.approx(spent)
    assert len(list((root / "journal").glob("*.jsonl"))) == 1


def test_the_identity_keeps_its_value_where_no_path_was_part_of_it() -> None:
    from cupid_exp.config import config_digest
    from cupid_exp.identity import job_identity

    resolved = {"model": {"name": "m"}, "data": {"name": "cupid", "source": "hf", "path": None}, "runtime": {"seed": 1},
                "paths": {"output_root": "x"}}
    before = config_digest({"config": {k: v for k, v in resolved.items() if k != "paths"}, "data": "d",
                            "prompts": "p"})  # the formula every existing job's journal is named by
    assert job_identity(resolved, dataset_digest="d", prompts_digest="p") == before
    local = {**resolved, "data": {"name": "local", "source": "local", "path": "data.jsonl"}}
    absolute = {**resolved, "data": {"name": "local", "source": "local", "path": "/abs/data.jsonl"}}
    assert job_identity(local, dataset_digest="d", prompts_digest="p") == job_identity(
        absolute, dataset_digest="d", prompts_digest="p") != job_identity(local, dataset_digest="e", prompts_digest="p")
