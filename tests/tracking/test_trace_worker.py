"""Traces are built and exported by a worker process beside the job; a worker that dies or cannot start
never costs the job its results or its run."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from conftest import compose_config
from helpers.cli_runner import job_dirs, read_jsonl
from helpers.cupid_data import stub_overrides, write_dataset
from helpers.stub_llm_server import StubServer
from tracking_runs import job_command, only_run, start, store_uri, traces_of, wait_for

from cupid_exp.data.loading import SAMPLE_FULL_PATH
from cupid_exp.job import execute, plan, publish, start_tracking, summarize_job
from cupid_exp.tracking import trace_worker

N = 8


def _in_process_job(url: str, root: Path):
    """A traced job, phase by phase in this process; returns its tracer as it was during the model phase."""
    cfg = compose_config([*stub_overrides(url), f"paths.output_root={root}", "runtime.progress=false",
                          f"tracking.uri={store_uri(root)}", "data=local", f"data.path={SAMPLE_FULL_PATH}",
                          "data.limit=4"])
    job = plan(cfg, root / "job")
    live = start_tracking(job)
    tracer = live.traces
    execution = execute(job, live)
    live.executed()
    publish(job, summarize_job(job, execution, 0.0), live)
    return tracer


def test_the_traces_are_written_by_another_process(tmp_path: Path) -> None:
    with StubServer() as stub:
        tracer = _in_process_job(stub.url, tmp_path)
    assert isinstance(tracer, trace_worker.TraceWorker) and tracer.pid != os.getpid()
    assert tracer.result is True and tracer.process.exitcode == 0  # it said it was done, then exited
    uri = store_uri(tmp_path)
    run = only_run(uri)
    assert run.info.status == "FINISHED" and len(traces_of(uri, run)) == 4


def test_without_a_worker_the_job_traces_in_its_own_process(tmp_path: Path, monkeypatch, caplog) -> None:
    def no_spawn() -> None:
        raise OSError("no processes left")

    monkeypatch.setattr(trace_worker, "TraceWorker", no_spawn)
    with StubServer() as stub, caplog.at_level(logging.WARNING):
        tracer = _in_process_job(stub.url, tmp_path)
    assert isinstance(tracer, trace_worker.InProcessTraces)
    assert "no trace worker (OSError: no processes left)" in caplog.text
    uri = store_uri(tmp_path)
    assert len(traces_of(uri, only_run(uri))) == 4


def _worker_of(pid: int) -> int:
    """The job's trace worker: its child process started by multiprocessing's spawn."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid and b"spawn_main" in cmdline:
            return int(entry)
    return 0


def test_a_worker_killed_mid_job_costs_the_traces_only(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    root, log = tmp_path / "out", tmp_path / "job.log"
    with StubServer() as stub:
        stub.hold_after(3 * N + 2)  # some instances finished, not all
        proc = start(job_command(stub.url, root, data, "model.max_concurrency=2"), log)
        try:
            assert stub.wait_held(timeout=120), log.read_text()[-3000:]
            worker = wait_for(lambda: _worker_of(proc.pid), 30, "the trace worker")
            os.kill(worker, signal.SIGKILL)
            stub.release()
            returncode = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
            stub.release()
    text = log.read_text()
    assert returncode == 0, text[-3000:]
    assert text.count("MLflow tracing stopped for this job: the trace worker exited (code -9)") == 1, text[-3000:]
    run = only_run(store_uri(root))
    assert run.info.status == "FINISHED" and run.data.tags["cupid.complete"] == "true"
    (job,) = job_dirs(root)
    assert len(read_jsonl(job / "instances.jsonl")) == N
    assert len(traces_of(store_uri(root), run)) < N  # (those the worker exported before it was killed)


def test_a_dead_worker_is_reported_once_and_never_waited_for(caplog) -> None:
    worker = trace_worker.TraceWorker()
    worker.process.kill()
    worker.process.join(10)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            worker.write(object(), None, None)  # never sent: the worker is gone
        assert worker.close() is False
    assert caplog.text.count("the trace worker exited (code -9)") == 1
