"""Synthesis runs on the job lifecycle evaluation has (``cupid_exp.job``), through the real CLI on the stub: the job
lock, the usage ledger across attempts, one MLflow run per job with progress while it runs, budgets, and an
identity that a faster or differently spelt endpoint does not change."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from helpers.cli_runner import run_cli, run_job, seed_store
from helpers.tracking_runs import held_job, held_job_settled, wait_for
from mlflow.tracking import MlflowClient

from cupid_exp.synthesis.config import ROLES
from cupid_exp.testing.inprocess import InProcessModel
from cupid_exp.testing.stub_llm_server import StubServer

from .scripted import role_overrides

SMALL = ["synthesis=api", "synthesis.max_turns=1", "synthesis.max_checklist_items=2"]
ONE_AT_A_TIME = [f"synthesis.roles.{role}.max_concurrency=1" for role in ROLES]  # a provider taking one call at once
PRICED = [f"synthesis.roles.{role}.model_info.{kind}_cost_per_token={price}" for role in ROLES
          for kind, price in (("input", "2.5e-06"), ("output", "1e-05"))]


def command(url: str, root: Path, *extra: str) -> list[str]:
    seed_store(root)
    return [sys.executable, "-m", "cupid_exp.synthesize", *SMALL, *role_overrides(url), f"paths.output_root={root}",
            f"calls.cache_dir={root / 'cache'}", "runtime.progress=false", "tracking.progress_every_s=0.5", *extra]


def runs(root: Path) -> list:
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cupid-synthesis")
    return client.search_runs([experiment.experiment_id]) if experiment is not None else []


def journalled(root: Path) -> list[dict]:
    return [json.loads(line) for p in (root / "journal").glob("*.jsonl") for line in p.read_text().splitlines()]


def job_folder(root: Path) -> Path:
    (folder,) = (root / "synthesis").iterdir()
    return folder


def test_a_running_synthesis_shows_progress_and_a_killed_one_resumes_in_its_run_with_every_attempts_usage(
        tmp_path: Path) -> None:
    """One call at a time (every role's max_concurrency=1), so one persona at a time: held after the first persona,
    the job is RUNNING in MLflow with progress points (a persona done, calls, spend). SIGKILLed there, the same
    command takes the job over in the same run and folder, sends only what was not answered (no reply is asked for
    twice), and ends FINISHED with the whole job's usage: the stub's count. Again, faster and spelt differently
    (concurrency, pacing, localhost), it is the same job: nothing left, no request, its run left as it was."""
    root = tmp_path / "out"
    with StubServer() as stub:
        cmd = command(stub.url, root, "synthesis.n_personas=3", *ONE_AT_A_TIME, *PRICED)
        with held_job(stub, cmd, tmp_path / "first.log", after=90) as first:
            assert [r["key"] for r in journalled(root)] == ["persona_001"]  # the first persona, whole
            uri = f"sqlite:///{root / 'mlflow.db'}"
            client = MlflowClient(uri)

            def progress() -> dict | None:  # the points come every 0.5 s from a thread: later on a busy CPU
                (run,) = runs(root)
                done = client.get_metric_history(run.info.run_id, "progress/personas_done")
                return run if run.info.status == "RUNNING" and any(m.value == 1 for m in done) and \
                    run.data.metrics.get("progress/calls", 0) >= 60 else None

            run = wait_for(progress, 60, "a progress point with one persona done and 60 calls while the run is RUNNING")
            assert run.data.metrics["progress/cost_usd"] > 0
            journeys = job_folder(root) / "journeys"  # one persona at a time: the third has not started
            assert (journeys / "persona_002.json").exists() and not (journeys / "persona_003.json").exists()
            held_job_settled(stub)
            held = stub.stats()["held"]
            first.send_signal(signal.SIGKILL)
            assert first.wait(timeout=30) == -signal.SIGKILL
        folder = job_folder(root)
        again = run_job(cmd)  # the takeover: in this process (the killed attempt was the process that mattered)
        stats = stub.stats()
        assert stats["repeated_completions"] == 0  # every reply the killed attempt got was kept (journey, cache)
        (run,) = runs(root)
        assert run.info.status == "FINISHED" and run.data.tags["cupid.attempt"] == "2"
        m = run.data.metrics
        assert m["calls/total"] == stats["total_completed"]  # every attempt's calls, no cache hit among them
        # what the kill left held unanswered is charged its worst case: the job could not know it was never billed
        assert m["calls/requests"] == stats["total_received"] and m["calls/unsettled"] == held
        assert 0 < m["calls/total/this_attempt"] < m["calls/total"]
        assert "taking over this job" in again.stdout + again.stderr and job_folder(root) == folder
        written = (folder / "instances" / "instances.jsonl").read_bytes()
        assert len(written.splitlines()) == 9

        faster = [f"synthesis.roles.{role}.{key}={value}" for role in ROLES
                  for key, value in (("max_concurrency", 32), ("pool.rpm", 6000))]
        spelt = stub.url.replace("127.0.0.1", "localhost") + "/"
        replay = run_job(command(spelt, root, "synthesis.n_personas=3", *PRICED, *faster))
        assert stub.stats()["total_received"] == stats["total_received"]  # nothing sent
    said = replay.stdout + replay.stderr
    assert "resuming: 3 of 3 personas already finished" in said and "this job finished earlier" in said
    assert job_folder(root) == folder and (folder / "instances" / "instances.jsonl").read_bytes() == written
    (run,) = runs(root)  # the run that holds the results is left as it was
    assert run.data.tags["cupid.attempt"] == "2" and run.info.status == "FINISHED"


def test_twin_launches_send_each_call_once(tmp_path: Path) -> None:
    """A second launch of a running synthesis stops at once (one line naming the first, exit 2) and sends
    nothing; the first completes, no reply asked for twice."""
    root = tmp_path / "out"
    with StubServer() as stub:
        cmd = command(stub.url, root, "synthesis.n_personas=2")
        with held_job(stub, cmd, tmp_path / "first.log", after=20) as first:
            received = held_job_settled(stub)
            second = run_cli(cmd, check=False, timeout=120)
            assert second.returncode == 2, (second.stdout[-2000:], second.stderr[-2000:])
            assert second.stderr.strip().splitlines()[-1].startswith(
                f"cupid_exp.synthesize: another process is running this job: pid {first.pid} on ")
            assert stub.stats()["total_received"] == received  # the twin sent nothing
            stub.release()
            assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-3000:]
        stats = stub.stats()
    assert stats["repeated_completions"] == 0 and stats["total_completed"] > 100
    (run,) = runs(root)
    assert run.info.status == "FINISHED" and run.data.tags["cupid.attempt"] == "1"


def test_a_budget_stops_synthesis_with_exit_4_and_a_resume_completes_it_with_the_same_instances(
        tmp_path: Path) -> None:
    """calls.max_cost_usd holds synthesis too: the job stops at it (exit 4, one BUDGET line naming the personas
    not run), the same command with a higher budget resumes it in its run, and the instances are those of a job
    that was never stopped, byte for byte (that one run by two processes, a persona each)."""
    with StubServer() as stub:
        cmd = command(stub.url, tmp_path / "out", "synthesis.n_personas=2", *PRICED)
        stopped = run_job([*cmd, "calls.max_cost_usd=0.05"], check=False)
        assert stopped.returncode == 4, (stopped.stdout[-2000:], stopped.stderr[-2000:])
        line = stopped.stderr.strip().splitlines()[-1]
        assert line.startswith("BUDGET: $") and "personas not run; resume with a higher budget" in line
        resumed = run_job([*cmd, "calls.max_cost_usd=100"])
        whole = run_cli(command(stub.url, tmp_path / "whole", "synthesis.n_personas=2", "runtime.workers=2", *PRICED),
                        timeout=300)
    assert "model calls shared by 2 processes" in whole.stdout + whole.stderr
    assert resumed.stdout.rstrip().endswith("complete: 2 of 2 personas synthesised")
    instances = [job_folder(tmp_path / r) / "instances" / "instances.jsonl" for r in ("out", "whole")]
    assert instances[0].read_bytes() == instances[1].read_bytes() and len(instances[0].read_bytes().splitlines()) == 6
    (run,) = runs(tmp_path / "out")
    assert run.info.status == "FINISHED" and run.data.tags["cupid.attempt"] == "2"
    assert run.data.metrics["cost/usd"] > run.data.metrics["cost/usd/this_attempt"] > 0


def test_a_top_up_continues_the_job_its_run_counting_every_attempts_requests(tmp_path: Path) -> None:
    """A larger n_personas is the same job (folder, journal, ledger, MLflow run): the smaller run's instances are a
    byte-identical prefix of the larger one's, and the run's usage is the whole job's, the stub's count."""
    root = tmp_path / "out"
    with InProcessModel() as stub:
        run_job(command(stub, root, "synthesis.n_personas=1"), timeout=300)
        first = (job_folder(root) / "instances" / "instances.jsonl").read_bytes()
        topped = run_job(command(stub, root, "synthesis.n_personas=2"), timeout=300)
        stats = stub.stats()
    assert "resuming: 1 of 2 personas already finished" in topped.stdout + topped.stderr
    both = (job_folder(root) / "instances" / "instances.jsonl").read_bytes()
    assert both.startswith(first) and len(both.splitlines()) == 2 * len(first.splitlines()) == 6
    (run,) = runs(root)
    m = run.data.metrics
    assert run.info.status == "FINISHED" and run.data.tags["cupid.attempt"] == "2"
    assert m["calls/total"] == stats["total_completed"] > m["calls/total/this_attempt"] > 0
    metrics = json.loads((job_folder(root) / "metrics.json").read_text())["metrics"]
    assert metrics["calls/total"] + metrics["calls/total/earlier_attempts"] == stats["total_completed"]


def test_ctrl_c_ends_a_synthesis_in_one_line_and_its_run_killed(tmp_path: Path) -> None:
    root = tmp_path / "out"
    with StubServer() as stub:
        with held_job(stub, command(stub.url, root, "synthesis.n_personas=2"), tmp_path / "job.log", after=30) as job:
            wait_for(lambda: runs(root), 60, "the job's run")
            job.send_signal(signal.SIGINT)
            assert job.wait(timeout=60) == 130
    last = (tmp_path / "job.log").read_text().strip().splitlines()[-1]
    assert last == "interrupted: 0 of 2 personas finished and journaled; run the same command to resume"
    (run,) = runs(root)
    assert run.info.status == "KILLED" and run.data.tags["cupid.outcome"] == "interrupted"
