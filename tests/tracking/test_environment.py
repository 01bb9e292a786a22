"""Environment failures are named, not called bugs: a full disk, a read-only or forbidden folder, a folder that
vanished end the job with one line naming the path and the error, exit 5; the journal keeps whole lines only, the
MLflow run ends FAILED (or, when its store is on the full disk, the next command repairs it)."""

from __future__ import annotations

import errno
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.cli_runner import PROJECT_ROOT, cli_env, read_jsonl, run_cli
from tracking_runs import job_command, only_run, store_uri

from cupid_exp.durability.journal import Journal
from cupid_exp.entry import EXIT_ENVIRONMENT
from cupid_exp.outputs import EnvironmentFailure, atomic_write_text, environment_failure
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
        again = run_cli(job_command(stub.url, root, data), timeout=240)
    assert f"resuming: 2 of {N}" in again.stdout + again.stderr
    keys = [r["key"] for r in read_jsonl(journal)]
    assert len(keys) == len(set(keys)) == N and only_run(store_uri(root)).info.status == "FINISHED"


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 3 MB tmpfs (needs the right to mount: root in this project's sandbox; skipped elsewhere)."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


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
        (journal,) = (tiny_disk / "journal").glob("*.jsonl")
        before = read_jsonl(journal)  # whole lines only
        assert len(before) < n
        subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_disk)], check=True)
        again = run_cli(cmd, timeout=300)
    if before:  # the disk may fill before the first instance is journalled: then there is nothing to resume
        assert f"resuming: {len(before)} of {n}" in again.stdout + again.stderr
    keys = [r["key"] for r in read_jsonl(journal)]
    assert len(keys) == len(set(keys)) == n and set(keys) >= {r["key"] for r in before}
    run = only_run(store_uri(tiny_disk))
    assert run.info.status == "FINISHED" and run.data.metrics["instances/total"] == n


def test_mlflows_store_errors_are_one_line_once_and_other_loggers_untouched() -> None:
    import logging

    from cupid_exp.tracking import store_logs

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
        store_logs.install()  # finds MLflow's handlers, this one among them
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
