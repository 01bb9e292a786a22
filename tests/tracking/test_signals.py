"""Interrupts end the run: SIGTERM or Ctrl-C mid-job leave it KILLED (never RUNNING), even while it logs."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from helpers.cupid_data import write_dataset
from helpers.stub_llm_server import StubServer
from mlflow.tracking import MlflowClient
from tracking_runs import history, job_command, only_run, start, store_uri, traces_of, wait_for

N = 8


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, None)], ids=["SIGTERM", "SIGINT"])
def test_an_interrupt_mid_job_ends_the_run_killed(tmp_path: Path, sig: int, code: int | None) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    root, log = tmp_path / "out", tmp_path / "job.log"
    uri = store_uri(root)
    with StubServer() as stub:
        stub.hold_after(N * 4 // 2)
        proc = start(job_command(stub.url, root, data, "model.max_concurrency=2"), log)
        try:
            assert stub.wait_held(timeout=120), log.read_text()[-3000:]
            client = MlflowClient(uri)
            run = wait_for(lambda: history(client, only_run(uri).info.run_id, "progress/instances_done")[-1][0] > 0
                           and only_run(uri), 30, "a progress point")
            assert run.info.status == "RUNNING"
            proc.send_signal(sig)
            returncode = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
            stub.release()
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


def test_an_interrupt_while_the_run_logs_its_results_never_leaves_it_running(tmp_path: Path) -> None:
    """SIGTERM as soon as the job has printed its table (MLflow logging follows it)."""
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
    # killed while logging, or (if the signal came after the run ended) finished and then stopped
    assert (run.info.status, returncode) in {("KILLED", 143), ("FINISHED", 143), ("FINISHED", 0)}, log.read_text()[-3000:]
    print("status after SIGTERM while logging:", run.info.status, returncode, run.data.tags.get("cupid.attempt.1"))
