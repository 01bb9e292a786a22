"""Environment failures are named, not called bugs: a full disk, a read-only or forbidden folder, a folder that
vanished end the job with one line naming the path and the error, exit 5; the journal keeps whole lines only, the
MLflow run ends FAILED (or, when its store is on the full disk, the next command repairs it)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.cli_runner import PROJECT_ROOT, cli_env, read_jsonl, run_job
from helpers.tmpfs import mount_tmpfs, unmount
from helpers.tracking_runs import job_command, only_run, store_uri

from cupid_exp.durability.journal import Journal
from cupid_exp.durability.ledger import ROOM_BYTES, UsageLedger
from cupid_exp.entry import EXIT_ENVIRONMENT
from cupid_exp.outputs import EnvironmentFailure, atomic_write_text, environment_failure, writing
from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.stub_llm_server import StubServer

N = 6


def _record(key: str) -> dict:
    return {"key": key, "persona_id": key, "instance_type": "t", "gt_preference": "p", "gt_checklist": ["a"],
            "gt_checklist_len": 1, "context_factor": "f", "n_context_sessions": 8, "relevant_positions": [1],
            "n_prior_sessions": 8, "history_words": 10, "errors": [], "raw": {}, "usage": {}}


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM])
def test_these_errnos_are_the_environments_wherever_they_are_raised(code: int) -> None:
    try:
        try:
            raise OSError(code, "injected", "/some/file")
        except OSError as exc:
            raise RuntimeError("the store could not write") from exc
    except RuntimeError as wrapped:
        failure = environment_failure(wrapped)
    assert failure is not None and "/some/file" in str(failure) and errno.errorcode[code] in str(failure)
    assert "\n" not in str(failure)


def test_other_errors_stay_bugs() -> None:
    assert environment_failure(OSError(errno.ENOENT, "No such file or directory", "x")) is None  # could be ours
    assert environment_failure(OSError(errno.EBADF, "Bad file descriptor")) is None
    assert environment_failure(TypeError("a bug")) is None


def test_a_folder_that_vanished_under_our_writes_is_the_environments(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal" / "j.jsonl")
    shutil.rmtree(tmp_path / "journal")
    gone = r"j\.jsonl: the journal was deleted while the job ran \[ENOENT\]; it held no finished instance yet"
    with pytest.raises(EnvironmentFailure, match=gone):
        journal.append(_record("a"))
    with pytest.raises(EnvironmentFailure, match=r"metrics\.json: No such file or directory \[ENOENT\]"):
        _vanishing_write(tmp_path)


def _vanishing_write(tmp_path: Path) -> None:
    """``atomic_write_text`` whose folder is removed between its creation and the write."""
    import tempfile

    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        shutil.rmtree(kwargs["dir"])
        return real(*args, **kwargs)

    tempfile.mkstemp = mkstemp
    try:
        atomic_write_text(tmp_path / "job" / "metrics.json", "{}")
    finally:
        tempfile.mkstemp = real


def test_a_full_disk_mid_line_leaves_whole_lines_and_stops_every_later_append(tmp_path: Path, monkeypatch) -> None:
    import cupid_exp.durability.journal as module

    path = tmp_path / "j.jsonl"
    journal = Journal(path)
    journal.append(_record("a"))
    writes = []

    def full(fd: int, data: bytes) -> int:
        writes.append(len(data))
        module_os_write(fd, bytes(data[:10]))
        raise OSError(errno.ENOSPC, "No space left on device")

    module_os_write = module.os.write
    monkeypatch.setattr(module.os, "write", full)
    with pytest.raises(EnvironmentFailure, match=r"j\.jsonl: No space left on device \[ENOSPC\]"):
        journal.append(_record("b"))
    with pytest.raises(EnvironmentFailure):
        journal.append(_record("c"))
    monkeypatch.undo()
    assert len(writes) == 1  # the second append never touched the disk
    assert [r["key"] for r in read_jsonl(path)] == ["a"]


def test_the_cli_on_a_failing_disk_exits_5_with_one_line_and_ends_its_run_failed(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    root = tmp_path / "out"
    with StubServer(latency_ms=1) as stub:
        cmd = job_command(stub.url, root, data)
        cmd[1:3] = [str(Path(__file__).with_name("env_failing_cli.py"))]
        proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=cli_env(CUPID_TEST_FAIL_AT="3", CUPID_TEST_ERRNO="ENOSPC"),
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == EXIT_ENVIRONMENT, (proc.stdout[-3000:], proc.stderr[-3000:])
        last = proc.stderr.strip().splitlines()[-1]
        (journal,) = (root / "journal").glob("*.jsonl")
        assert last.startswith(f"cupid_exp: environment failure: {journal}: No space left on device [ENOSPC]")
        assert "Traceback" not in proc.stdout + proc.stderr
        kept = read_jsonl(journal)  # whole lines only: the half-written one was cut
        assert len(kept) == 2
        assert only_run(store_uri(root)).info.status == "FAILED"
        # the disk is fine again: the same command resumes and completes
        again = run_job(job_command(stub.url, root, data))  # the resume: in this process
    assert f"resuming: 2 of {N}" in again.stdout + again.stderr
    keys = [r["key"] for r in read_jsonl(journal)]
    assert len(keys) == len(set(keys)) == N and only_run(store_uri(root)).info.status == "FINISHED"


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 3 MB tmpfs (needs the right to mount: root in this project's sandbox; skipped elsewhere)."""
    where = tmp_path / "disk"
    mount_tmpfs(where, "3m")
    try:
        yield where
    finally:
        unmount(where)


@pytest.mark.slow
def test_a_really_full_disk_exits_5_and_the_rerun_on_a_freed_disk_completes(tmp_path: Path, tiny_disk: Path) -> None:
    n = 30
    data = write_dataset(tmp_path / "data.jsonl", n)
    with StubServer(latency_ms=1) as stub:
        cmd = job_command(stub.url, tiny_disk, data, seed=False)  # the store, the cache and the journal on it
        proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=cli_env(), capture_output=True, text=True, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode == EXIT_ENVIRONMENT, out[-4000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(f"cupid_exp: environment failure: {tiny_disk}") and "[ENOSPC]" in last
        assert "Traceback" not in out and len(out.splitlines()) < 200, out[-4000:]
        # whole lines only; none when the disk filled before the first instance was journalled (or the journal made)
        journals = list((tiny_disk / "journal").glob("*.jsonl"))
        assert len(journals) <= 1
        before = read_jsonl(journals[0]) if journals else []
        assert len(before) < n
        subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_disk)], check=True)
        again = run_job(cmd)
    if before:  # the disk may fill before the first instance is journalled: then there is nothing to resume
        assert f"resuming: {len(before)} of {n}" in again.stdout + again.stderr
    (journal,) = (tiny_disk / "journal").glob("*.jsonl")
    keys = [r["key"] for r in read_jsonl(journal)]
    assert len(keys) == len(set(keys)) == n and set(keys) >= {r["key"] for r in before}
    run = only_run(store_uri(tiny_disk))
    assert run.info.status == "FINISHED" and run.data.metrics["instances/total"] == n


@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_a_read_only_output_root_is_one_line_and_exit_5(tmp_path: Path, sweep: bool) -> None:
    """Hydra makes the job's (or the sweep's) folder under the output root before any job of ours runs: its error
    is the environment's, said in one line, not Hydra's traceback."""
    root = tmp_path / "out"
    mount_tmpfs(root, "64k", "ro")
    try:
        with pytest.raises(OSError):  # read-only, even to root
            (root / "x").write_text("")
        cmd = job_command("http://127.0.0.1:9/v1", root, tmp_path / "none.jsonl", "calls.dry_run=true", seed=False)
        if sweep:
            cmd[3:3] = ["-m"]
            cmd.append("model.name=a,b")
        proc = run_job(cmd, check=False)
    finally:
        unmount(root)
    said = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == EXIT_ENVIRONMENT, proc.stderr[-3000:]
    assert len(said) == 1 and said[0].startswith(f"cupid_exp: environment failure: {root}/"), said
    assert "Read-only file system [EROFS]" in said[0] and "Traceback" not in proc.stdout + proc.stderr


def test_sqlites_full_database_is_a_full_disk_naming_the_path(tmp_path: Path) -> None:
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(tmp_path / "store.db")) as con:
        con.execute("CREATE TABLE t (x BLOB)")
        con.execute("PRAGMA max_page_count = 3")  # SQLite's own SQLITE_FULL, as on a full disk
        with pytest.raises(EnvironmentFailure, match=rf"^environment failure: {tmp_path}: No space left on device "
                                                     r"\[ENOSPC\]"):
            with writing(tmp_path):
                con.execute("INSERT INTO t VALUES (?)", (bytes(100_000),))
        with pytest.raises(sqlite3.OperationalError):  # any other SQLite error stays what it is
            with writing(tmp_path):
                con.execute("INSERT INTO nowhere VALUES (1)")


def test_a_failure_that_names_its_path_wins_over_a_later_one_that_does_not() -> None:
    try:
        try:
            raise EnvironmentFailure("/the/ledger.jsonl", OSError(errno.ENOSPC, "No space left on device"))
        except EnvironmentFailure:
            raise OSError(errno.ENOSPC, "No space left on device")  # noqa: B904 - a later write's, no file name; chained implicitly as in the job
    except OSError as last:
        failure = environment_failure(last)
    assert failure is not None and str(failure).startswith("environment failure: /the/ledger.jsonl: No space left")


def _fill(disk: Path, leave: int = 0) -> None:
    """Take all of ``disk``'s space but ``leave`` bytes."""
    stat = os.statvfs(disk)
    with (disk / "filler").open("ab") as out:
        try:
            out.write(bytes(max(0, stat.f_bavail * stat.f_frsize - leave)))
            out.flush()
        except OSError:
            pass


def _free(disk: Path) -> int:
    stat = os.statvfs(disk)
    return stat.f_bavail * stat.f_frsize


def test_the_usage_ledger_writes_what_was_paid_into_the_room_it_kept_when_the_disk_fills_up(tiny_disk: Path) -> None:
    ledger = UsageLedger.beside(tiny_disk / "journal" / "j.jsonl")
    ledger.load()  # the job's start: the room is kept
    assert ledger.room.stat().st_size == ROOM_BYTES
    _fill(tiny_disk)
    with pytest.raises(EnvironmentFailure, match=rf"^environment failure: {ledger.path}: No space left on device"):
        ledger.append("infer", {"calls": 1, "cost_usd": 0.5})  # a reply that came back as the disk filled up
    ledger.append("infer", {"abandoned_requests": 1, "cost_usd": 0.25})  # one in flight at the stop
    assert not ledger.room.exists()
    assert [json.loads(line)["cost_usd"] for line in ledger.path.read_text().splitlines()] == [0.5, 0.25]


def test_a_disk_too_full_for_the_ledgers_room_stops_the_job_at_its_start_and_gets_the_space_back(
        tiny_disk: Path) -> None:
    ledger = UsageLedger.beside(tiny_disk / "journal" / "j.jsonl")
    (tiny_disk / "journal" / "usage").mkdir(parents=True)
    _fill(tiny_disk, leave=ROOM_BYTES // 2)
    before = _free(tiny_disk)
    with pytest.raises(EnvironmentFailure, match=rf"^environment failure: {ledger.path.parent}: No space left"):
        ledger.load()
    assert not ledger.room.exists() and _free(tiny_disk) == before


def test_the_response_cache_on_a_full_disk_is_one_environment_failure_naming_its_folder(tiny_disk: Path,
                                                                                        capfd) -> None:
    """At the start (the store cannot be made) and at a call (litellm swallows and logs a failed cache write: the
    call raises ours instead, once it has counted the reply it paid for); litellm prints nothing of its own."""
    import asyncio

    from cupid_exp.config import CallsConfig, ModelConfig
    from cupid_exp.llm import client as client_module
    from cupid_exp.llm.client import LLMClient, configure_litellm
    from cupid_exp.llm.response_cache import STORE_FOLDER, DiskResponseStore
    from cupid_exp.llm.usage import UsageMeter
    from cupid_exp.testing.fault_server import ScriptedServer, completion_body

    folder = tiny_disk / "cache" / STORE_FOLDER
    client_module._CACHE_DIR = None
    runtime = CallsConfig(cache_dir=str(tiny_disk / "cache"), num_retries=0, timeout=30)
    configure_litellm(runtime)
    with ScriptedServer([(200, completion_body("six"), {})]) as server:
        client = LLMClient(ModelConfig(name="m", litellm_model="openai/scripted", api_base=server.url), runtime,
                           UsageMeter())
        _fill(tiny_disk)
        with pytest.raises(EnvironmentFailure, match=rf"^environment failure: {folder}: No space left on device"):
            asyncio.run(client.complete([{"role": "user", "content": "five?"}], step="s"))
        assert len(server.requests) == 1 and client.meter.counts["s"]["calls"] == 1
    with pytest.raises(EnvironmentFailure, match=rf"^environment failure: {tiny_disk / 'other'}: No space left"):
        DiskResponseStore(tiny_disk / "other")
    client_module._CACHE_DIR = None
    assert "LiteLLM" not in capfd.readouterr().err


def test_mlflows_store_errors_are_one_line_once_and_other_loggers_untouched() -> None:
    import logging

    from cupid_exp.tracking import store_errors

    class Kept(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    kept = Kept()
    logging.getLogger("mlflow").addHandler(kept)
    logging.getLogger("cupid_exp.anything").addHandler(kept)
    try:
        store_errors.install()  # finds MLflow's handlers, this one among them
        for _ in range(3):
            try:
                raise RuntimeError("(sqlite3.OperationalError) database or disk is full\n[SQL: INSERT ...]")
            except RuntimeError:
                logging.getLogger("mlflow.store.db.utils").exception("SQLAlchemy database error.\nmore")
            logging.getLogger("cupid_exp.anything").warning("ours\nsecond line")
    finally:
        logging.getLogger("mlflow").removeHandler(kept)
        logging.getLogger("cupid_exp.anything").removeHandler(kept)
    mlflow_lines = [r for r in kept.records if r.name.startswith("mlflow")]
    assert len(mlflow_lines) == 1 and mlflow_lines[0].exc_info is None
    assert mlflow_lines[0].getMessage() == ("SQLAlchemy database error. (RuntimeError: (sqlite3.OperationalError) "
                                            "database or disk is full)")
    ours = [r for r in kept.records if r.name == "cupid_exp.anything"]
    assert len(ours) == 3 and ours[0].getMessage() == "ours\nsecond line"
