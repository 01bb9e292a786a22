"""How a run ends, as scripts see it: exit codes, the last printed line, metrics.json and MLflow.

0 complete (or within runtime.max_failed_fraction), 1 a bug (traceback; the journal keeps what
finished), 2 a bad setting or bad data before any call, 3 incomplete. A sweep runs every job first.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers.cli_runner import PROJECT_ROOT, cli_command, cli_env, job_dirs, read_jsonl, run_cli, run_job, seed_store
from mlflow.tracking import MlflowClient

from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.inprocess import InProcessModel
from cupid_exp.testing.stub_llm_server import StubServer

N = 9


def runs(root: Path) -> list:
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    return client.search_runs([client.get_experiment_by_name("cupid").experiment_id])


def test_a_bug_stops_the_job_loudly_and_the_journal_keeps_what_finished(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    root = tmp_path / "out"
    with StubServer(latency_ms=30) as stub:
        cmd = cli_command(stub.url, root, "tracking=none", "model.max_concurrency=1", data=data,
                          cache_dir=tmp_path / "cache")
        cmd[1:3] = [str(PROJECT_ROOT / "tests" / "helpers" / "buggy_cli.py")]
        # the bug from the 4th reply on, once an instance is journaled (under load the first instances can
        # still be waiting on the evaluator when later replies are parsed)
        proc = run_cli(cmd, env=cli_env(CUPID_TEST_BUG_AT="4", CUPID_TEST_BUG_AFTER_JOURNAL=str(root / "journal")),
                       check=False)
        assert proc.returncode == 1
        assert "TypeError: injected bug in the preference parser" in proc.stderr
        assert "Traceback" in proc.stderr or "HYDRA_FULL_ERROR" in proc.stderr
        (journal,) = (root / "journal").glob("*.jsonl")
        finished = read_jsonl(journal)
        assert 0 < len(finished) < N and all(not r["errors"] and r["f1"] is not None for r in finished)
        # without the bug the same command resumes: only the rest runs, nothing is duplicated
        fixed = run_job(cli_command(stub.url, root, "tracking=none", "model.max_concurrency=1", data=data,
                                    cache_dir=tmp_path / "cache"))  # the resume: no process of its own needed
    assert f"resuming: {len(finished)} of {N} instances already finished" in fixed.stdout + fixed.stderr
    (job,) = [d for d in job_dirs(root) if (d / "metrics.json").exists()]
    records = read_jsonl(job / "instances.jsonl")
    assert len({r["key"] for r in records}) == N and not any(r["errors"] for r in records)


def test_an_incomplete_run_exits_3_and_says_so_everywhere(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    root = tmp_path / "out"
    with InProcessModel(giveup_match="(variant 2)") as stub:
        proc = run_job(cli_command(stub, root, "calls.num_retries=0", "runtime.max_failed_fraction=0.05",
                                   data=data, cache_dir=tmp_path / "cache"), check=False)
        assert proc.returncode == 3, proc.stderr[-2000:]
        assert proc.stdout.rstrip().splitlines()[-1] == (
            f"INCOMPLETE: 1 of {N} instances failed (infer/provider=1); "
            "above runtime.max_failed_fraction=0.05: exit 3")
        (job,) = job_dirs(root)
        saved = json.loads((job / "metrics.json").read_text())
        assert saved["complete"] is False and saved["failed_instances"] == 1
        assert saved["failure_reasons"] == {"infer/provider": 1}
        (run,) = runs(root)  # not a green check: FAILED, with the job's own line as its reason and description
        line = proc.stdout.rstrip().splitlines()[-1]
        assert run.data.tags["cupid.complete"] == "false" and run.info.status == "FAILED"
        assert run.data.tags["cupid.outcome"] == "incomplete" and run.data.tags["cupid.reason"] == line
        assert run.data.tags["mlflow.note.content"] == f"incomplete: {line}"
        assert run.data.metrics["instances/failed"] == 1
        tolerant = run_job(cli_command(stub, tmp_path / "tolerant", "tracking=none",
                                       "calls.num_retries=0", "runtime.max_failed_fraction=0.2",
                                       data=data, cache_dir=tmp_path / "cache"))
    assert tolerant.stdout.rstrip().splitlines()[-1].endswith("within runtime.max_failed_fraction=0.2")


def test_a_resume_retries_provider_failures_but_keeps_unusable_replies_unless_asked(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    root = tmp_path / "out"
    common = ("tracking=none", "calls.num_retries=0", "runtime.reask=0", "runtime.max_failed_fraction=1")
    with InProcessModel(giveup_match="(variant 2)", garbage_steps=("decompose",), garbage_rate=0.3, seed=1) as stub:
        run_job(cli_command(stub, root, *common, data=data, cache_dir=tmp_path / "c1"))
        (job,) = job_dirs(root)
        first = {r["key"]: r for r in read_jsonl(job / "instances.jsonl")}
        kinds = {k: {e["kind"] for e in r["errors"]} for k, r in first.items() if r["errors"]}
        assert {"provider"} in kinds.values() and {"unparseable"} in kinds.values()
        stub.reset()
        run_job(cli_command(stub, root, *common, data=data, cache_dir=tmp_path / "c2"))
        retried = stub.stats()["received"]
        provider_failed = sum(1 for k in kinds.values() if k == {"provider"})
        assert retried.get("infer") == provider_failed  # only the provider failure ran again
        stub.reset()
        run_job(cli_command(stub, root, *common, "runtime.retry_failed=true", data=data,
                            cache_dir=tmp_path / "c3"))
        assert stub.stats()["received"].get("infer") == len(kinds)  # every failed instance ran again


def test_a_sweep_runs_its_valid_jobs_and_reports_the_invalid_ones(tmp_path: Path) -> None:
    root = tmp_path / "out"
    seed_store(root)
    with InProcessModel() as stub:
        proc = run_job([sys.executable, "-m", "cupid_exp", "-m", *stub.overrides(),
                        f"paths.output_root={root}", "runtime.progress=false", "data.limit=2",
                        "task=inference,generation", "setting=oracle_preference,standard"], check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "sweep: 1 of 4 jobs did not complete:" in proc.stderr
    assert "inference_oracle_preference" in proc.stderr and "defined for generation only" in proc.stderr
    done = [d for d in job_dirs(root) if (d / "metrics.json").exists()]
    assert len(done) == 3
    statuses = {r.data.tags.get("cupid.kind"): r.info.status for r in runs(root) if
                r.data.tags.get("cupid.kind") == "sweep"}
    assert statuses == {"sweep": "FAILED"}


def test_a_composition_error_exits_2_before_any_call(tmp_path: Path) -> None:
    proc = run_job([sys.executable, "-m", "cupid_exp", "model=no_such_model", f"paths.output_root={tmp_path}"],
                   check=False)
    assert proc.returncode == 2 and "no_such_model" in proc.stderr
    proc = run_job([sys.executable, "-m", "cupid_exp", "runtime.failure_policy=bogus",
                    f"paths.output_root={tmp_path}"], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "cupid_exp: runtime.failure_policy='bogus' is not allowed: one of ['exclude', 'zero', 'upstream']")


def test_the_calls_line_counts_requests_sent_even_when_every_call_fails(tmp_path: Path) -> None:
    """A run whose every call timed out used to print 'calls: 0 ... $0.0000' while requests reached the server."""
    with StubServer(rate_slow=1.0, slow_s=4.0) as stub:
        proc = run_cli(cli_command(stub.url, tmp_path / "out", "tracking=none", "data.limit=2", "calls.timeout=1",
                                   "calls.num_retries=1", cache_dir=tmp_path / "c"), check=False, timeout=120)
        received = stub.stats()["total_received"]
    assert proc.returncode == 3
    assert received == 4  # 2 instances x (1 request + 1 retry) on the infer step
    assert "calls: 0 ok (0 cached), 2 failed; requests sent: 4 (2 retries)" in proc.stdout
