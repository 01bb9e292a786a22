"""Interrupts end the run: SIGTERM or Ctrl-C mid-job leave it KILLED (never RUNNING), even while it logs."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from helpers.cli_runner import run_job
from helpers.processes import alive, children
from helpers.tracking_runs import held_job, history, job_command, only_run, start, store_uri, traces_of, wait_for
from mlflow.tracking import MlflowClient

from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.stub_llm_server import StubServer

N = 8


@pytest.mark.parametrize("sig, code, workers", [(signal.SIGTERM, 143, 1), (signal.SIGINT, None, 1),
                                               (signal.SIGTERM, 143, 2), (signal.SIGINT, None, 2),
                                               (signal.SIGHUP, 129, 1)],
                         ids=["SIGTERM", "SIGINT", "SIGTERM-2-processes", "SIGINT-2-processes", "SIGHUP"])
def test_an_interrupt_mid_job_ends_the_run_killed(tmp_path: Path, sig: int, code: int | None, workers: int) -> None:
    """With ``runtime.workers=2`` the job stops its worker too (a Ctrl-C reaches the worker as well, which leaves
    it to the job): no process of the job is left. A stop signal (SIGTERM: a scheduler's preemption) says so in the
    line Ctrl-C prints, and the same command resumes."""
    data = write_dataset(tmp_path / "data.jsonl", N)
    root, log = tmp_path / "out", tmp_path / "job.log"
    uri = store_uri(root)
    # more than 3 of 4 calls per instance done: some instances finished, not all
    with StubServer() as stub:
        cmd = job_command(stub.url, root, data, "model.max_concurrency=2", f"runtime.workers={workers}")
        with held_job(stub, cmd, log, after=3 * N + 2) as proc:
            client = MlflowClient(uri)
            run = wait_for(lambda: history(client, only_run(uri).info.run_id, "progress/instances_done")[-1][0] > 0
                           and only_run(uri), 30, "a progress point")
            assert run.info.status == "RUNNING"
            started = children(proc.pid)
            # Ctrl-C reaches every process of the terminal's foreground group; SIGTERM only the job
            for pid in [proc.pid, *(started if sig == signal.SIGINT else [])]:
                os.kill(pid, sig)
            returncode = proc.wait(timeout=60)
            wait_for(lambda: not any(alive(pid) for pid in started), 30, "the job's processes to end")
        text = log.read_text()
        assert returncode != 0, text[-3000:]
        if code is not None:
            assert returncode == code, text[-3000:]
        run = only_run(uri)
        assert run.info.status == "KILLED" and run.info.end_time is not None
        assert run.data.tags["cupid.attempt.1"].startswith("KILLED with ")
        # what finished before the interrupt is in the run: its progress and its traces
        finished = int(run.data.metrics["progress/instances_done"])
        assert 0 < finished < N and len(traces_of(uri, run)) == finished
        said = [line for line in text.splitlines() if line.startswith("interrupted")]
        by = "" if sig == signal.SIGINT else f" ({signal.Signals(sig).name})"
        assert said == [f"interrupted{by}: {finished} of {N} instances finished and journaled; run the same "
                        "command to resume"], text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        if sig == signal.SIGTERM and workers == 1:  # the same command resumes, in the same run (in this process)
            again = run_job(cmd, check=False)
            assert again.returncode == 0, again.stderr[-3000:]
            run = only_run(uri)
            assert run.info.status == "FINISHED" and int(run.data.metrics["progress/instances_done"]) == N


def test_an_interrupt_while_the_run_logs_its_results_never_leaves_it_running(tmp_path: Path) -> None:
    """SIGTERM as soon as the job has printed its table: the logging that follows is shielded, so the run ends
    FINISHED with everything logged and the signal is delivered after it (143)."""
    data = write_dataset(tmp_path / "data.jsonl", N)
    root, log = tmp_path / "out", tmp_path / "job.log"
    with StubServer() as stub:
        proc = start(job_command(stub.url, root, data), log)
        try:
            wait_for(lambda: "| MLflow run " in log.read_text(), 180, "the printed table")
            proc.send_signal(signal.SIGTERM)
            returncode = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    run = only_run(store_uri(root))
    assert run.info.status != "RUNNING"
    # finished, then stopped by the held signal (or, if the signal came after the process was done, exit 0)
    assert (run.info.status, returncode) in {("FINISHED", 143), ("FINISHED", 0)}, log.read_text()[-3000:]
    logged = {a.path for a in MlflowClient(store_uri(root)).list_artifacts(run.info.run_id)}
    assert run.data.tags["cupid.complete"] == "true" and "instances_table.json" in logged
    print("status after SIGTERM while logging:", run.info.status, returncode, run.data.tags.get("cupid.attempt.1"))


def test_sigterm_to_a_sweep_ends_its_running_job_and_its_parent_killed(tmp_path: Path) -> None:
    import sys

    from helpers.tracking_runs import PRICES

    from cupid_exp.testing.cupid_data import stub_overrides

    data = write_dataset(tmp_path / "data.jsonl", N)
    root, log = tmp_path / "out", tmp_path / "sweep.log"
    uri = store_uri(root)
    with StubServer() as stub:
        cmd = [sys.executable, "-m", "cupid_exp", "-m", *stub_overrides(stub.url), *PRICES,
               f"paths.output_root={root}", "runtime.progress=false", "data=local", f"data.path={data}",
               "model.name=stub_a,stub_b", "calls.cache=false"]  # (the cache would answer the second job)
        # the first job finishes; the second is stuck
        with held_job(stub, cmd, log, after=N * 4 + N, timeout=180) as proc:
            wait_for(lambda: len(_runs(uri, "job")) == 2, 30, "the second job's run")
            proc.send_signal(signal.SIGTERM)
            returncode = proc.wait(timeout=60)
    assert returncode == 143, log.read_text()[-3000:]
    jobs = {r.data.params["model.name"]: r.info.status for r in _runs(uri, "job")}
    assert jobs == {"stub_a": "FINISHED", "stub_b": "KILLED"}
    assert [r.info.status for r in _runs(uri, "sweep")] == ["KILLED"]


def _runs(uri: str, kind: str) -> list:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("cupid")
    return [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("cupid.kind") == kind]


def test_a_sweep_worker_told_to_stop_stops_the_jobs_queued_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A joblib sweep's worker whose job a stop signal ended runs no further job: loky hands it the next one queued
    before the sweep's process stops (``durability.signals._stop_sweep_jobs``); that job stops before its run."""
    import time

    from cupid_exp.durability import signals

    monkeypatch.setattr(signals, "_in_sweep_worker", lambda: True)
    monkeypatch.setattr(signals, "_WATCHING_LAUNCHER", True)  # no watch of this process's parent
    monkeypatch.setattr(signals, "_STOPPED", 0)
    with pytest.raises(signals.Terminated):
        with signals.sigterm_raises():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    started = []
    with pytest.raises(signals.Terminated) as later:
        with signals.sigterm_raises():
            started.append("the next job")
    assert started == [] and later.value.signum == signal.SIGTERM
