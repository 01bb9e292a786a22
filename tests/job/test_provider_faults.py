"""Providers' faults end to end through the CLI's entry (in this process, ``run_job``, but for the requests that time
out: their timing is the CLI's own), against the stub behaving as OpenAI does (issue 33): replies
without usage, requests that time out after the provider processed them, 200s without a completion, a daily rate
limit, refusals of the Batch API's upload and its enqueued-token limit.

Each test checks that the fault happened (the stub's counters), then the invariants: no instance lost (a resume
completes the job), the spend counted at least what the stub billed and within the budget, the documented exit
code, and one line on stderr without a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from helpers import spend
from helpers.cli_runner import cli_command, cli_env, job_dirs, metrics_of, run_cli, run_job
from helpers.spend import journaled, one_line, settled, spent

from cupid_exp.llm.budget import Prices, worst_case_usd
from cupid_exp.testing.batch_api import BatchQueueConfig
from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.inprocess import InProcessModel
from cupid_exp.testing.stub_llm_server import StubServer

N = 6
IN, OUT, MAX_TOKENS = 1e-7, 2e-6, 600
ROLES = ("model", "evaluator.decomposer", "evaluator.matcher", "evaluator.judge")
PRICES = [f"{role}.{key}={value}" for role in ROLES for key, value in (
    ("model_info.input_cost_per_token", IN), ("model_info.output_cost_per_token", OUT),
    ("params.max_tokens", MAX_TOKENS))]
ONE_AT_A_TIME = [f"{role}.max_concurrency=1" for role in ROLES]  # 2 instances in flight: a budget stops part-way
BATCH = ["calls.batch=true", "calls.batch_delay_s=0.2", "calls.batch_poll_s=0.2"]


def billed_usd(stats: dict) -> float:
    return spend.billed_usd(stats, IN, OUT)


def resume_completes(cmd: list[str], root: Path, run: Callable[..., Any] = run_job) -> None:
    """No instance lost: the same job, resumed without the fault, journals every instance without a failure."""
    proc = run(cmd, timeout=240)
    assert proc.returncode == 0
    records = {r["key"]: r for r in journaled(root)}  # a retried failure is journaled again: the last one counts
    assert len(records) == N and not any(r["errors"] for r in records.values())


def test_replies_without_usage_are_costed_and_a_budget_stops_them(tmp_path: Path) -> None:
    data, root, budget = write_dataset(tmp_path / "data.jsonl", N), tmp_path / "out", 0.005
    with InProcessModel(omit_usage=True) as stub:
        cmd = cli_command(stub, root, *PRICES, *ONE_AT_A_TIME, data=data, cache_dir=tmp_path / "cache")
        hit = run_job([*cmd, f"calls.max_cost_usd={budget}"], check=False, timeout=240)
        first = stub.stats()
        assert hit.returncode == 4, (hit.stdout[-2000:], hit.stderr[-2000:])
        assert first["billed"]["requests"] == first["total_completed"] > 0  # every reply billed, none said so
        assert billed_usd(first) <= spent(root) <= budget
        one_line(hit.stderr, "BUDGET:")
        m = metrics_of(job_dirs(root)[0])
        assert m["tokens/estimated_calls"] == m["calls/total"] > 0 and m["tokens/prompt"] > 0
        assert f"({int(m['calls/total'])} calls' usage estimated); cost: ${m['cost/usd']:.4f}" in hit.stdout
        resume_completes([*cmd, "calls.max_cost_usd=1"], root)
        assert billed_usd(stub.stats()) <= spent(root)  # over both attempts
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("cupid").experiment_id])
    assert run.data.metrics["tokens/estimated_calls"] > 0


def test_requests_that_time_out_are_charged_so_no_fault_sends_past_the_budget(tmp_path: Path) -> None:
    data, root, budget = write_dataset(tmp_path / "data.jsonl", N), tmp_path / "out", 0.006
    with StubServer(rate_slow=1.0, slow_s=1.2, record_bodies=True) as stub:  # processed, billed, after the timeout
        cmd = cli_command(stub.url, root, *PRICES, "calls.timeout=0.4", "calls.num_retries=3", "tracking=none",
                          data=data, cache_dir=tmp_path / "cache")
        hit = run_cli([*cmd, f"calls.max_cost_usd={budget}"], check=False, timeout=240)
        stats = settled(stub)
        assert hit.returncode == 4, (hit.stdout[-2000:], hit.stderr[-2000:])
        slow = sum(f.get("slow", 0) for f in stats["faults"].values())
        assert slow == stats["total_received"] == stats["billed"]["requests"] >= 2  # each one timed out, billed
        # every request sent is charged its worst case: together they fit the budget (one reservation per call
        # used to carry num_retries + 1 requests)
        worst = sum(worst_case_usd(Prices(IN, OUT), body["messages"], body) for body in stub.bodies)
        assert billed_usd(stats) <= worst == pytest.approx(spent(root)) and spent(root) <= budget
        one_line(hit.stderr, "BUDGET:")
        stub.config.faults.rate_slow = 0.0
        resume_completes([*cmd, "calls.max_cost_usd=1"], root, run_cli)


@pytest.mark.parametrize("kind", ["empty_choices", "content_null"])
def test_a_200_without_a_completion_is_retried_and_costs_no_instance(tmp_path: Path, kind: str) -> None:
    data, root = write_dataset(tmp_path / "data.jsonl", N), tmp_path / "out"
    with InProcessModel(fail_first=1, fail_first_kind=kind, fault_steps=("decompose",)) as stub:
        proc = run_job(cli_command(stub, root, *PRICES, "calls.max_cost_usd=1", "tracking=none", data=data,
                                   cache_dir=tmp_path / "cache"), check=False, timeout=240)
        stats = stub.stats()
    assert stats["faults"]["decompose"][kind] >= N  # the first reply of every decomposition had no completion
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    records = journaled(root)
    assert len(records) == N and not any(r["errors"] for r in records)
    m = metrics_of(job_dirs(root)[0])
    assert m["calls/retries"] >= N and m["calls/failed"] == 0
    assert billed_usd(stats) <= spent(root) <= 1  # the empty replies' prompts too
    assert spent(root) == pytest.approx(m["cost/usd"])
    assert "Traceback" not in proc.stderr


def test_a_daily_limit_stops_the_job_for_later_and_a_resume_completes_it(tmp_path: Path) -> None:
    data, root = write_dataset(tmp_path / "data.jsonl", N), tmp_path / "out"
    with StubServer(latency_ms=150) as good, StubServer(refuse="daily") as limited:
        # the subject answers, two at a time; the evaluator's key has used its requests for the day: the instances
        # whose inference is done are in flight when the first refusal comes
        cmd = cli_command(good.url, root, "tracking=none", "model.max_concurrency=2",
                          *(f"evaluator.{role}.api_base={limited.url}" for role in ("decomposer", "matcher", "judge")),
                          data=data, cache_dir=tmp_path / "cache")
        proc = run_job(cmd, check=False)
        refused = limited.stats()["faults"]
        assert proc.returncode == 75, (proc.stdout[-2000:], proc.stderr[-2000:])
        assert sum(f.get("daily", 0) for f in refused.values()) >= 1
        # the calls in flight when the first refusal came at most: not one per instance, none retried
        assert limited.stats()["total_received"] < N, limited.stats()["total_received"]
        line = one_line(proc.stderr, "cupid_exp: stopped:")
        assert "requests per day" in line and "wait 3600 s" in line and "run the same command later" in line
        assert not any(r["errors"] for r in journaled(root))  # the instances in flight are not failed
        limited.config.limits.refuse = ""
        limited.reset()
        resume_completes(cmd, root)


def _synthesize(url: str, root: Path) -> list[str]:
    from synthesis.scripted import role_overrides

    return [sys.executable, "-m", "cupid_exp.synthesize", "synthesis.n_personas=1", "synthesis.max_turns=2",
            "runtime.progress=false", "tracking=none", *role_overrides(url), f"paths.output_root={root}",
            f"calls.cache_dir={root / 'cache'}"]


@pytest.mark.parametrize("mode", ["workers", "sweep", "batch", "synthesis"])
def test_a_daily_limit_means_the_same_in_every_mode(tmp_path: Path, mode: str) -> None:
    data, root = write_dataset(tmp_path / "data.jsonl", N), tmp_path / "out"
    batch = BatchQueueConfig(refuse_upload="daily") if mode == "batch" else None
    with StubServer(refuse="" if batch else "daily", batch=batch) as stub:
        cmd = cli_command(stub.url, root, "tracking=none", data=data, cache_dir=tmp_path / "cache")
        if mode == "workers":
            cmd.append("runtime.workers=2")
        elif mode == "sweep":
            cmd = [*cmd[:3], "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *cmd[3:], "seed=0,1"]
        elif mode == "batch":
            cmd += BATCH
        elif mode == "synthesis":
            cmd = _synthesize(stub.url, root)
        proc = run_job(cmd, env=cli_env(), check=False)
        stats = stub.stats()
    refusals = stub.batches.upload_refusals if batch else sum(f.get("daily", 0) for f in stats["faults"].values())
    assert refusals >= 1 and stats["total_completed"] == 0
    assert proc.returncode == 75, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr
    program = "cupid_exp.synthesize" if mode == "synthesis" else "cupid_exp"
    lines = [line for line in proc.stderr.splitlines() if line.startswith(f"{program}: stopped:")]
    assert len(lines) == (2 if mode == "sweep" else 1), proc.stderr[-3000:]  # one per job
    assert all("requests per day" in line and "wait 3600 s" in line for line in lines)
    assert not any(r["errors"] for r in journaled(root))


def test_a_batch_upload_refused_for_credit_stops_the_job_with_one_line(tmp_path: Path) -> None:
    data, root = write_dataset(tmp_path / "data.jsonl", N), tmp_path / "out"
    with StubServer(batch=BatchQueueConfig(refuse_upload="insufficient_quota")) as stub:
        cmd = cli_command(stub.url, root, "tracking=none", *BATCH, data=data, cache_dir=tmp_path / "cache")
        proc = run_job(cmd, check=False)
        assert stub.batches.upload_refusals == 1 and stub.batches.submissions == 0
        assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
        line = one_line(proc.stderr, "cupid_exp: stopped:")
        assert "insufficient_quota" in line and "(model openai_compatible)" in line
        assert not any(r["errors"] for r in journaled(root))
        stub.batches.config.refuse_upload = ""
        resume_completes(cmd, root)


def test_batches_over_the_enqueued_token_limit_are_held_not_failed(tmp_path: Path) -> None:
    data, root = write_dataset(tmp_path / "data.jsonl", N), tmp_path / "out"
    limit = 6000  # tokens: the first batch (six inference prompts, ~1,600 each) is over it, two of them are not
    with StubServer(batch=BatchQueueConfig(complete_after_s=0.3, enqueued_token_limit=limit)) as stub:
        proc = run_job(cli_command(stub.url, root, "tracking=none", *BATCH, data=data, cache_dir=tmp_path / "cache"),
                       check=False)
        batches = list(stub.batches.batches.values())
    assert stub.batches.token_limit_rejections >= 1, [b.tokens for b in batches]
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    records = journaled(root)
    assert len(records) == N and not any(r["errors"] for r in records)
    assert all(b.tokens <= limit for b in batches if b.rejection is None)
    assert metrics_of(job_dirs(root)[0])["batch/held_token_limit"] >= 1
