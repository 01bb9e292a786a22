"""The Batch API path (``calls.batch=true``): the CLI's entry against the stub's Files and Batch endpoints, in this
process (``run_job``) but for the job that is killed.

The stub answers a batch row exactly as it answers the same request live, so a batch job must give the
synchronous job's scores; it counts batch submissions, so a resumed job that re-submitted is caught.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.cli_runner import PROJECT_ROOT, cli_command, cli_env, job_dirs, metrics_of, read_jsonl, run_job, scoring
from helpers.spend import billed_usd, settled, spent

from cupid_exp.testing.batch_api import BatchQueueConfig
from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.stub_llm_server import StubServer

FAST = ("calls.batch=true", "calls.batch_delay_s=0.2", "calls.batch_poll_s=0.2", "tracking=none")
N = 6


def _records(root: Path) -> list[dict]:
    job = job_dirs(root)[-1]  # a resumed job's folder holds every instance
    return sorted(read_jsonl(job / "instances.jsonl"), key=lambda r: r["key"])


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "data.jsonl", N)


def test_a_batch_job_scores_as_the_live_job_with_no_live_call(tmp_path: Path, data: Path) -> None:
    with StubServer(batch=BatchQueueConfig(complete_after_s=0.3)) as stub:
        run_job(cli_command(stub.url, tmp_path / "live", "tracking=none", data=data))
        live_requests = stub.stats()["total_received"]
        assert live_requests > 0 and stub.batches.submissions == 0
        proc = run_job(cli_command(stub.url, tmp_path / "batch", *FAST, data=data))
        assert stub.stats()["total_received"] == live_requests, "the batch job sent a live request"
        # inference: the subject's batch, then decompose, then both match directions (one batch each, or merged)
        assert 3 <= stub.batches.submissions <= 4, stub.batches.submissions
    assert scoring(_records(tmp_path / "batch")) == scoring(_records(tmp_path / "live"))
    metrics = metrics_of(job_dirs(tmp_path / "batch")[0])
    assert metrics["batch/submitted"] == stub.batches.submissions
    assert metrics["batch/rows_submitted"] == metrics["calls/total"]
    assert "batches: " in proc.stdout


def test_failed_rows_are_sent_again_and_an_expired_batch_resubmitted(tmp_path: Path, data: Path) -> None:
    config = BatchQueueConfig(complete_after_s=0.2, row_fail_rate=0.3, expire_batches=(1,))
    with StubServer(batch=config) as stub:
        run_job(cli_command(stub.url, tmp_path / "live", "tracking=none", data=data))
        run_job(cli_command(stub.url, tmp_path / "batch", *FAST, data=data))
    metrics = metrics_of(job_dirs(tmp_path / "batch")[0])
    assert metrics["batch/expired"] == 1
    assert metrics["batch/rows_resubmitted"] > N  # the expired batch's N rows and the failed rows
    assert metrics["calls/failed"] == 0
    assert scoring(_records(tmp_path / "batch")) == scoring(_records(tmp_path / "live"))


def test_rows_that_keep_failing_are_counted_by_kind_not_scored(tmp_path: Path, data: Path) -> None:
    with StubServer(batch=BatchQueueConfig(complete_after_s=0.1, row_fail_rate=1.0)) as stub:
        proc = run_job(cli_command(stub.url, tmp_path / "b", *FAST, "calls.num_retries=1", data=data), check=False)
    assert proc.returncode == 3, proc.stderr[-2000:]
    records = _records(tmp_path / "b")
    assert all(r.get("f1") is None for r in records)
    assert all(("infer", "provider") in [(e["step"], e["kind"]) for e in r["errors"]] for r in records)
    assert stub.batches.submissions == 2  # the first batch, then its rows once more


def test_a_killed_job_collects_its_pending_batch_instead_of_resubmitting(tmp_path: Path, data: Path) -> None:
    with StubServer(batch=BatchQueueConfig(complete_after_s=1.0)) as stub:
        run_job(cli_command(stub.url, tmp_path / "once", *FAST, cache_dir=tmp_path / "cache-once", data=data))
        uninterrupted = stub.batches.submissions
    cache = tmp_path / "cache"
    with StubServer(batch=BatchQueueConfig(complete_after_s=3.0)) as stub:
        cmd = cli_command(stub.url, tmp_path / "b", *FAST, cache_dir=cache, data=data)
        proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=cli_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while stub.batches.submissions == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stub.batches.submissions == 1
        time.sleep(0.3)  # journaled right after it was created
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert (cache / "batches" / "batches.jsonl").exists()
        run_job(cmd)
        # the subject's batch was collected by the rerun, not sent again
        assert stub.batches.submissions == uninterrupted
        assert [b.status for b in stub.batches.batches.values() if b.number == 1] == ["completed"]
        run_job(cmd)
        assert stub.batches.submissions == uninterrupted  # a complete resume sends nothing
    assert len(_records(tmp_path / "b")) == N
    assert scoring(_records(tmp_path / "b")) == scoring(_records(tmp_path / "once"))


ROLES = ("model", "evaluator.decomposer", "evaluator.matcher", "evaluator.judge")
PRICED = (*[f"{role}.model_info.{kind}_cost_per_token={price}" for role in ROLES for kind, price in (("input", 2e-6),
                                                                                         ("output", 1e-5))],
          *[f"{role}.params.max_tokens=600" for role in ROLES])


def test_an_unreadable_result_line_sends_its_row_again_and_is_charged(tmp_path: Path, data: Path) -> None:
    """Every row's first result line is cut (answered and billed, unreadable): each row goes into a later batch and
    the job completes; the unreadable attempts are counted, and charged (their worst case) in the metrics and on the
    budget, so the spend covers what the provider billed."""
    with StubServer(batch=BatchQueueConfig(complete_after_s=0.1, garble_rows=1.0)) as stub:
        proc = run_job(cli_command(stub.url, tmp_path, *FAST, *PRICED, "calls.max_cost_usd=5", data=data))
        billed, garbled = billed_usd(settled(stub), 2e-6, 1e-5), stub.batches.rows_garbled
    metrics = metrics_of(job_dirs(tmp_path)[0])
    assert garbled == metrics["batch/rows_unreadable"] == metrics["batch/rows_resubmitted"] > 0
    assert metrics["cost/charged_requests"] == garbled and metrics["calls/failed"] == 0
    assert metrics["cost/usd"] >= billed and spent(tmp_path) >= billed > 0
    assert f"{garbled} unreadable" in proc.stdout
    assert len(_records(tmp_path)) == N and not [r for r in _records(tmp_path) if r["errors"]]


def test_a_row_whose_result_line_is_never_readable_fails_after_its_retries(tmp_path: Path, data: Path) -> None:
    config = BatchQueueConfig(complete_after_s=0.1, garble_rows=1.0, garble_runs=99)
    with StubServer(batch=config) as stub:
        proc = run_job(cli_command(stub.url, tmp_path, *FAST, *PRICED, "calls.num_retries=1", data=data),
                       check=False)
        billed = billed_usd(settled(stub), 2e-6, 1e-5)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert stub.batches.submissions == 2  # the first batch, then its rows once more
    assert all(("infer", "provider") in [(e["step"], e["kind"]) for e in r["errors"]] for r in _records(tmp_path))
    metrics = metrics_of(job_dirs(tmp_path)[0])
    assert metrics["cost/charged_requests"] == stub.batches.rows_garbled == metrics["batch/rows_submitted"] > 0
    assert metrics["cost/usd"] >= billed > 0


def test_a_batch_rejected_as_a_whole_fails_only_its_rows(tmp_path: Path, data: Path) -> None:
    with StubServer(batch=BatchQueueConfig(complete_after_s=0.1)) as stub:
        original = stub.batches._finish

        def reject_first(batch):  # a provider that refuses the first batch's input file
            if batch.number == 1:
                stub.batches.files[batch.input_file_id] = b"not json\n"
            original(batch)

        stub.batches._finish = reject_first
        proc = run_job(cli_command(stub.url, tmp_path / "b", *FAST, data=data), check=False)
    assert proc.returncode == 3
    records = _records(tmp_path / "b")
    assert all([(e["step"], e["kind"]) for e in r["errors"]] == [("infer", "provider")] for r in records)
    assert "was rejected: a line of the input file is not a request" in proc.stdout + proc.stderr


def test_the_dry_run_shows_batch_prices(tmp_path: Path) -> None:
    proc = run_job(["python", "-m", "cupid_exp", "model=gpt4o", "calls.dry_run=true", "tracking=none",
                    f"paths.output_root={tmp_path}"], env=cli_env(OPENAI_API_KEY="sk-dry"))
    line = next(line for line in proc.stdout.splitlines() if line.startswith("total:"))
    full = float(line.split("~$")[1].split()[0].rstrip(";"))
    batch = float(line.split("with calls.batch=true ~$")[1].split()[0])
    assert batch == pytest.approx(full / 2, rel=0.01)


def test_the_mlflow_run_has_the_batches_at_batch_prices(tmp_path: Path, data: Path) -> None:
    from helpers.tracking_runs import PRICES, only_run, store_uri

    with StubServer(batch=BatchQueueConfig(complete_after_s=1.5)) as stub:
        run_job(cli_command(stub.url, tmp_path, *PRICES, *FAST[:-1], "tracking.progress_every_s=0.2", data=data))
        ids = sorted(stub.batches.batches)
    run = only_run(store_uri(tmp_path))
    assert sorted(run.data.tags["cupid.batch_ids"].split()) == ids
    assert run.data.metrics["batch/submitted"] == len(ids)
    # the configured prices are taken as they are (the stub is no model litellm prices at batch rates)
    assert run.data.metrics["cost/usd"] > 0


def test_a_parallel_sweep_in_batch_mode_completes(tmp_path: Path, data: Path) -> None:
    """Two joblib jobs share the cache folder's batch ledger (a file lock) and the stub's queue."""
    with StubServer(batch=BatchQueueConfig(complete_after_s=0.3)) as stub:
        cmd = cli_command(stub.url, tmp_path, *FAST, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                          "setting=standard,oracle", data=data)
        proc = run_job([*cmd[:3], "-m", *cmd[3:]], timeout=240)
        assert stub.stats()["total_received"] == 0  # no live call
    jobs = job_dirs(tmp_path)
    assert len(jobs) == 2, proc.stdout[-2000:]
    for job in jobs:
        assert len(read_jsonl(job / "instances.jsonl")) == N
        assert metrics_of(job)["calls/failed"] == 0


def test_a_batch_ledger_of_garbage_is_set_aside_and_a_torn_line_is_not(tmp_path: Path, caplog) -> None:
    """Bytes that are not text (a torn copy) no longer stop the job: the list is renamed aside with one warning and
    no batch is open; a list whose only fault is a killed writer's torn line keeps its place and its entries."""
    import logging

    from cupid_exp.llm.batch_ledger import BatchLedger

    ledger = BatchLedger(tmp_path / "batches")
    path = tmp_path / "batches" / "batches.jsonl"
    garbage = b"\x00\x17not an entry\xff\n" * 30
    path.write_bytes(garbage)
    with pytest.raises(UnicodeDecodeError):  # the fault: what the ledger read before fails on it
        path.read_text(encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="cupid_exp.aside"):
        assert ledger.open_batches() == {}
    (aside,) = path.parent.glob("batches.jsonl.corrupt-*")
    assert aside.read_bytes() == garbage and not path.exists()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"batch ledger {path} is unreadable (not one readable entry): set aside as {aside.name}")

    ledger.submitted("b1", {"model": "m"}, "f1", {"r1": "d1"})
    with path.open("ab") as fh:
        fh.write(b'{"batch": "b2", "rows": {"r')  # a killed writer's last line
    assert list(ledger.open_batches()) == ["b1"] and len(list(path.parent.glob("*.corrupt-*"))) == 1


def test_epochs_go_through_the_batch_api_each_its_own_seeded_row(tmp_path: Path, data: Path) -> None:
    with StubServer(batch=BatchQueueConfig(complete_after_s=0.3)) as stub:
        run_job(cli_command(stub.url, tmp_path / "batch", *FAST, "runtime.epochs=2", data=data))
        assert stub.stats()["total_received"] == 0 and stub.batches.submissions >= 3  # no live request
        rows = [json.loads(line) for file in stub.batches.files.values() for line in file.decode().splitlines()
                if line.strip()]
    bodies = [row["body"] for row in rows if isinstance(row.get("body"), dict) and "messages" in row["body"]]
    seeds = [body.get("seed") for body in bodies]
    assert seeds.count(0) == seeds.count(1) == 4 * N and len(seeds) == 8 * N  # 4 calls per instance and epoch
    metrics = metrics_of(job_dirs(tmp_path / "batch")[0])
    assert metrics["batch/rows_submitted"] == metrics["calls/total"] == 8 * N
    assert sorted(r["epoch"] for r in _records(tmp_path / "batch")) == [0] * N + [1] * N
