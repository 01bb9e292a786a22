"""A tracking server that goes away for good never holds a job's results hostage: the job finishes its instances,
journals them, and ends within ``tracking.flush_timeout_s`` with one line, exit 5; the same command, once the server
is back, publishes the metrics and every instance's trace into the same run, FINISHED, without a model call."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers.cli_runner import cli_env, read_jsonl, run_job
from helpers.mlflow_server import answers, free_port, kill, serve
from helpers.tracking_runs import job_command, only_run, start, traces_of, wait_for

from cupid_exp.entry import EXIT_ENVIRONMENT
from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.stub_llm_server import StubServer

pytestmark = pytest.mark.slow  # two server starts

N = 8
FLUSH_S = 10  #: tracking.flush_timeout_s for these jobs
SLACK_S = 20  #: what a loaded 2-core machine adds to it (the job's own exit, the worker's kill)


def _journalled(root: Path) -> list[dict]:
    return [r for p in (root / "journal").glob("*.jsonl") for r in read_jsonl(p)]


def test_a_server_gone_for_good_ends_the_job_in_bounded_time_and_the_next_command_publishes_it_all(tmp_path):
    folder = tmp_path / "server"
    folder.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data = write_dataset(tmp_path / "data.jsonl", N)
    root, log = tmp_path / "out", tmp_path / "job.log"
    server = serve(folder, port, cli_env())
    job = None
    try:
        with StubServer() as stub:
            cmd = job_command(stub.url, root, data, f"tracking.uri={url}", f"tracking.flush_timeout_s={FLUSH_S}",
                              seed=False)
            # MLflow's own default: every call to a dead server is retried for minutes before it fails
            stub.hold_after(4 * N - 8)  # most instances finished, a few in flight
            job = start(cmd, log, new_session=True, MLFLOW_HTTP_REQUEST_MAX_RETRIES="7")
            assert stub.wait_held(timeout=120), log.read_text()[-3000:]
            wait_for(lambda: _journalled(root) and traces_of(url, only_run(url)), 60, "a journalled, traced instance")
            kill(server)  # the server dies for good, mid-job
            assert not answers(url)
            stub.release()
            wait_for(lambda: "complete: " in log.read_text(), 120, "the job's table")
            printed = time.monotonic()
            returncode = job.wait(timeout=FLUSH_S + SLACK_S)
            waited = time.monotonic() - printed
            print(f"the job ended {waited:.1f} s after its table (tracking.flush_timeout_s={FLUSH_S})")
            text = log.read_text()
            assert returncode == EXIT_ENVIRONMENT, text[-3000:]
            assert waited < FLUSH_S + SLACK_S
            assert "Traceback" not in text
            last = text.strip().splitlines()[-1]
            assert last.startswith(f"cupid_exp: environment failure: the MLflow store at {url} did not take this "
                                   f"job's results (no answer within {FLUSH_S} s); the results are in "), text[-3000:]
            assert "run the same command again once the store answers" in last
            assert len({r["key"] for r in _journalled(root)}) == N  # every instance journalled

            server = serve(folder, port, cli_env())  # back, with the same store
            sent = stub.stats()["total_received"]
            again = run_job(cmd, park=False)  # in this process: its process is not the point
            assert stub.stats()["total_received"] == sent  # nothing asked of a model again
        assert f"resuming: {N} of {N}" in again.stdout + again.stderr
        run = only_run(url)  # one run: the first attempt's, finished by the second
        traces = traces_of(url, run)
    finally:
        if job is not None and job.poll() is None:
            kill(job)
        kill(server)
    assert run.info.status == "FINISHED" and run.data.tags["cupid.attempt"] == "2"
    assert run.data.metrics["calls/total"] == 4 * N and run.data.metrics["instances/total"] == N
    keys = sorted(t.info.tags["cupid.key"] for t in traces)
    assert keys == sorted(f"{r['persona_id']}/{r['instance_type']}" for r in read_jsonl(data))  # each once
    rebuilt = [t for t in traces if t.info.tags.get("cupid.rebuilt")]
    assert 0 < len(rebuilt) < N  # those the dead server never got, rebuilt from the journal
