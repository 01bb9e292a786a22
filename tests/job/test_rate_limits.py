"""A real key's limits, end to end through the CLI's entry (in this process, ``run_job``, but for the paced pool,
whose pace is the CLI's own): a limit that lifts costs time, not instances; one that never lifts stops the job at the
patience deadline for later (exit 75), no instance failed; a bad key, a refused region, an unknown model or an
account out of credit stops the job after its first calls (exit 2, one line), the journal kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cli_runner import cli_command, job_dirs, metrics_of, read_jsonl, run_cli, run_job

from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.stub_llm_server import StubServer

N = 6


@pytest.mark.slow
def test_a_limit_that_lifts_after_a_few_seconds_costs_no_instance(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    with StubServer(closed_s=3.0, latency_ms=20) as stub:
        # num_retries=0: before, the first 429 of each call failed its instance
        proc = run_job(cli_command(stub.url, tmp_path / "out", "tracking=none", "calls.num_retries=0",
                                   data=data, cache_dir=tmp_path / "cache"))
        st = stub.stats()
    assert st["rate_limited"] >= 1
    (job,) = job_dirs(tmp_path / "out")
    records = read_jsonl(job / "instances.jsonl")
    assert len(records) == N and not any(r["errors"] for r in records)
    metrics = metrics_of(job)
    assert metrics["calls/rate_limited"] == st["rate_limited"] and metrics["calls/failed"] == 0
    assert "after a 429" in proc.stdout and "waiting on rate limits" in proc.stdout


@pytest.mark.slow
def test_a_limit_that_never_lifts_stops_the_job_for_later_at_the_patience_deadline(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", 3)
    with StubServer(closed_s=float("inf")) as stub:
        proc = run_job(cli_command(stub.url, tmp_path / "out", "tracking=none", "calls.rate_limit_patience_s=2",
                                   data=data, cache_dir=tmp_path / "cache"), check=False)
    assert proc.returncode == 75, proc.stderr[-2000:]  # try again later, not 3: no instance failed
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("cupid_exp: stopped:")]
    assert "rate_limit_patience_s=2" in line and "requests per min" in line and "Traceback" not in proc.stderr
    journals = list((tmp_path / "out" / "journal").glob("*.jsonl"))
    assert all(not r["errors"] for j in journals for r in read_jsonl(j))  # nothing journaled as a failure


@pytest.mark.slow
@pytest.mark.parametrize("refuse,kind", [("401", "auth"), ("403", "auth"), ("404", "model_not_found"),
                                         ("insufficient_quota", "insufficient_quota")])
def test_a_fatal_refusal_stops_the_job_after_its_first_calls(tmp_path: Path, refuse: str, kind: str) -> None:
    data = write_dataset(tmp_path / "data.jsonl", 24)
    root = tmp_path / "out"
    with StubServer() as good, StubServer(refuse=refuse) as bad:
        # the subject answers; the evaluator's key is refused
        cmd = cli_command(good.url, root, "tracking=none", "calls.num_retries=3", "model.max_concurrency=2",
                          *(f"evaluator.{role}.api_base={bad.url}" for role in ("decomposer", "matcher", "judge")),
                          data=data, cache_dir=tmp_path / "cache")
        proc = run_job(cmd, check=False)
        refused, answered = bad.stats()["total_received"], good.stats()["total_received"]
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.startswith("cupid_exp: stopped:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "evaluator.decomposer, evaluator.matcher, evaluator.judge (model" in lines[0]
    assert f"{kind}: " in lines[0] and refuse in lines[0]
    # the calls in flight when the first refusal came: at most the pool's starting concurrency (a quarter of the
    # bound its three roles share, 16: 4; how many of them go out before the refusal returns depends on the CPU),
    # not one (or four, retried) per instance (24, 96)
    assert refused <= 4, refused
    assert answered < 24, answered  # no call of any role sent after it (the subject's in flight finished)
    assert "Traceback" not in proc.stderr
    journals = list((root / "journal").glob("*.jsonl")) if (root / "journal").exists() else []
    assert all(not r["errors"] for j in journals for r in read_jsonl(j))  # nothing journaled as a failure


@pytest.mark.slow
def test_a_pools_limit_given_once_paces_every_role_and_shows_in_the_calls_line(tmp_path: Path) -> None:
    """A server that holds every model in one 300 RPM pool: the limit given once for the pool (not per role) paces
    the subject and the evaluator roles together; the calls: line and the metrics show the pool."""
    from cupid_exp.llm.pools import pool_name

    data = write_dataset(tmp_path / "data.jsonl", N)
    with StubServer(rpm=300, limits_pool="key", latency_ms=20) as stub:
        pool = pool_name("openai/stub", stub.url)
        proc = run_cli(cli_command(stub.url, tmp_path / "out", "tracking=none", f"+calls.pools.{pool}.rpm=300",
                                   data=data, cache_dir=tmp_path / "cache"), timeout=240)
        st = stub.stats()
    assert st["total_completed"] >= 4 * N and st["rate_limited"] <= 1, st
    (job,) = job_dirs(tmp_path / "out")
    metrics = metrics_of(job)
    assert metrics[f"pools/{pool}/rpm"] == 300 and metrics[f"pools/{pool}/answered_429"] == st["rate_limited"]
    assert metrics[f"pools/{pool}/peak_in_flight"] >= 1
    calls_line = next(line for line in proc.stdout.splitlines() if line.startswith("calls:"))
    assert f"pool {pool}: " in calls_line and "paced at 300 RPM" in calls_line
