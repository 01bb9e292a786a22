"""Files deleted under a running job: the line says what is lost and what is not.

A journal folder deleted mid-job ends it (exit 5) with a line that says the journal is gone (never "the journal
keeps what finished"), and the resume keeps the earlier attempt's spend in MLflow, read from the run's own
progress metrics since the usage ledger went with the folder. A job folder deleted mid-job is made again, with
the results and the resolved config, and said in one line."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from helpers.cli_runner import job_dirs, read_jsonl, run_job
from helpers.tracking_runs import held_job, history, job_command, only_run, store_uri, wait_for
from mlflow.tracking import MlflowClient

from cupid_exp.entry import EXIT_ENVIRONMENT
from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.stub_llm_server import StubServer

N = 6


def _journalled(root: Path) -> int:
    return sum(len(read_jsonl(p)) for p in (root / "journal").glob("*.jsonl"))


def _settled(root: Path) -> int:
    """The instances journalled, once the count stays the same for a second (the stub holds every other reply)."""
    last = -1
    while (now := _journalled(root)) != last:
        last = now
        time.sleep(1.0)
    return now


def test_a_deleted_journal_is_said_and_the_resume_keeps_the_earlier_spend(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    root, log = tmp_path / "out", tmp_path / "job.log"
    uri = store_uri(root)
    with StubServer() as stub:
        cmd = job_command(stub.url, root, data)
        with held_job(stub, cmd, log, after=4 * N - 6) as proc:  # some instances journalled, the rest in flight
            wait_for(lambda: _journalled(root) >= 1, 60, "a journalled instance")
            journal = next((root / "journal").glob("*.jsonl"))
            held = _settled(root)  # read once it stops growing (a busy CPU journalled a second one after the first)
            # the run's progress has the calls paid so far (a point every 0.5 s)
            wait_for(lambda: only_run(uri).data.metrics.get("progress/calls", 0) >= 4 * held, 60, "a progress point")
            shutil.rmtree(root / "journal")
            stub.release()
            returncode = proc.wait(timeout=120)
        text = log.read_text()
        assert returncode == EXIT_ENVIRONMENT, text[-3000:]
        last = text.strip().splitlines()[-1]
        assert last.startswith(f"cupid_exp: environment failure: {journal}: the journal was deleted while the job "
                               f"ran [ENOENT]; the {held} finished instances it held are no longer journalled: the "
                               "same command runs them again"), last
        assert "the journal keeps what finished" not in text and "Traceback" not in text
        first = only_run(uri)
        assert first.info.status == "FAILED" and first.data.tags["cupid.outcome"] == "environment"
        spent = first.data.metrics["progress/cost_usd"]
        paid = first.data.metrics["progress/calls"]
        assert spent > 0

        again = run_job(cmd)  # every instance again (the response cache answers what it kept)
    out = again.stdout + again.stderr
    assert f"the job's usage ledger is gone: its earlier attempts' {paid:g} calls and ${spent:.4f} are carried" in out
    run = only_run(uri)
    m = run.data.metrics
    assert run.info.run_id == first.info.run_id and run.info.status == "FINISHED"
    assert m["cost/usd/earlier_attempts"] == pytest.approx(spent) and m["calls/total/earlier_attempts"] == paid
    assert m["cost/usd"] == pytest.approx(spent + m["cost/usd/this_attempt"])
    assert m["calls/total"] == paid + m["calls/total/this_attempt"]
    assert run.data.tags["cupid.earlier_usage"].startswith("the run's last progress point")
    # the attempts' curves go on from one another: the second's time starts where the first's stopped
    seconds = [value for _, value in history(MlflowClient(uri), run.info.run_id, "progress/seconds")]
    assert seconds == sorted(seconds)


def test_a_job_folder_deleted_mid_job_is_made_again_and_said(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    root, log = tmp_path / "out", tmp_path / "job.log"
    with StubServer() as stub:
        with held_job(stub, job_command(stub.url, root, data), log, after=4) as proc:
            folder = wait_for(lambda: next((root / "runs").glob("*/*/.hydra"), None), 60, "the job folder").parent
            shutil.rmtree(folder)
            stub.release()
            returncode = proc.wait(timeout=120)
    text = log.read_text()
    assert returncode == 0, text[-3000:]
    lines = [line for line in text.splitlines() if line.startswith("job folder ")]
    assert lines == [f"job folder {folder} was deleted while the job ran: made again with its results and "
                     ".hydra/config.yaml (the resolved config; Hydra's overrides.yaml and hydra.yaml are lost)"]
    assert job_dirs(root) == [folder] and len(read_jsonl(folder / "instances.jsonl")) == N
    config = (folder / ".hydra" / "config.yaml").read_text()
    assert "litellm_model: openai/stub" in config and f"path: {data}" in config
    run = only_run(store_uri(root))
    assert {a.path for a in MlflowClient(store_uri(root)).list_artifacts(run.info.run_id, ".hydra")} == {
        ".hydra/config.yaml"}
