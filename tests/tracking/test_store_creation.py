"""The first command on a new SQLite store can be killed at any instant: MLflow's migrations (not transactional on
SQLite) run on a store made aside and moved into place whole, so the store's path holds nothing or a whole store,
and the next command works. A store half made before (by an older version) is recognised and made again."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest
from helpers.cli_runner import run_cli
from helpers.tracking_runs import job_command, only_run, start, store_uri

from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.stub_llm_server import StubServer

KILL_AFTER_S = (0.0, 0.5, 1.2)  #: after a store file first appears (MLflow's migrations take seconds here)


def _store_files(root: Path) -> list[Path]:
    """The store and any store being made beside it (not SQLite's -journal files)."""
    return sorted(p for p in root.glob("*mlflow.db*") if p.suffix not in (".lock", ".db-journal")
                  and not p.name.endswith("-journal"))


def _state(db: Path) -> str:
    """'whole' (MLflow's latest schema, no migration left half-way), else 'half' (an empty file, tables without
    the schema's head revision, or alembic's temporary tables). Read from a copy, with its rollback journal: a
    transaction the kill cut leaves a hot journal, which SQLite rolls back (a write) before anyone reads the file,
    so the copy shows what the next command would see, and the original stays untouched."""
    import shutil
    import tempfile

    from mlflow.store.db.utils import _get_latest_schema_revision

    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / db.name
        shutil.copyfile(db, copy)
        if Path(f"{db}-journal").exists():
            shutil.copyfile(f"{db}-journal", f"{copy}-journal")
        return _schema_state(copy, _get_latest_schema_revision())


def _schema_state(db: Path, head: str) -> str:
    with closing(sqlite3.connect(db, timeout=10)) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        version = con.execute("SELECT version_num FROM alembic_version").fetchall() if "alembic_version" in tables \
            else []
    whole = version == [(head,)] and not any(t.startswith("_alembic_tmp") for t in tables)
    return "whole" if whole else "half"


def _group_alive(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if entry.name.isdigit() and fields[0] != "Z" and int(fields[2]) == pgid:
                return True
        except (OSError, IndexError, ValueError):
            continue
    return False


def test_a_first_command_killed_at_any_instant_of_the_stores_creation_leaves_one_the_next_command_uses(tmp_path):
    data = write_dataset(tmp_path / "data.jsonl", 2)
    root = tmp_path / "out"
    half_made_seen = []
    with StubServer() as stub:
        cmd = job_command(stub.url, root, data, seed=False)  # no store yet: the command makes it
        for delay in KILL_AFTER_S:
            proc = start(cmd, tmp_path / f"killed-{delay}.log", new_session=True)
            try:
                deadline = time.monotonic() + 120
                while not _store_files(root) and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert _store_files(root), (tmp_path / f"killed-{delay}.log").read_text()[-3000:]
                time.sleep(delay)
                os.killpg(proc.pid, signal.SIGKILL)  # the job and its MLflow worker, which makes the store
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
            deadline = time.monotonic() + 30
            while _group_alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _group_alive(proc.pid)  # nothing of it runs on
            states = {p.name: _state(p) for p in _store_files(root)}
            half_made_seen.append("half" in states.values())
            # the store's own path: nothing yet, or a whole store (a half-made one is only ever beside it)
            assert states.get("mlflow.db", "whole") == "whole", states
        finished = run_cli(cmd, timeout=240)
    assert any(half_made_seen), "no kill landed while the store was half made: move KILL_AFTER_S"
    assert "Traceback" not in finished.stderr
    assert only_run(store_uri(root)).info.status == "FINISHED"
    assert [p.name for p in _store_files(root)] == ["mlflow.db"]  # what the kills left aside is gone


def _prepare(db: Path):
    """``prepare_store`` in a new process, as a command would."""
    import subprocess
    import sys

    from helpers.cli_runner import PROJECT_ROOT, cli_env

    code = f"from cupid_exp.tracking.mlflow import prepare_store; prepare_store({f'sqlite:///{db}'!r})"
    return subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=cli_env(), capture_output=True,
                          text=True, timeout=120)


def _half_made(db: Path) -> None:
    """As a migration killed half-way leaves it: an old revision, alembic's temporary table still there."""
    with closing(sqlite3.connect(db)) as con:
        con.execute("CREATE TABLE _alembic_tmp_experiments (experiment_id INTEGER)")
        con.execute("UPDATE alembic_version SET version_num = '451aebb31d03'")
        con.commit()


def test_a_store_half_made_before_is_made_again_and_one_with_runs_is_left_alone(tmp_path) -> None:
    """A store an older version left half-migrated: MLflow refuses it; it holds no run, so it is moved aside and
    made again (one line). One that holds a run is never replaced: MLflow's error stands."""
    from mlflow.tracking import MlflowClient

    db = tmp_path / "mlflow.db"
    assert _prepare(db).returncode == 0 and _state(db) == "whole"
    _half_made(db)
    assert _state(db) == "half"
    repaired = _prepare(db)
    assert repaired.returncode == 0, repaired.stderr[-2000:]
    assert _state(db) == "whole" and "was half made" in repaired.stderr
    assert len(list(tmp_path.glob("mlflow.db.half-made-*"))) == 1  # kept aside, not deleted

    MlflowClient(f"sqlite:///{db}").create_run("0")
    _half_made(db)
    refused = _prepare(db)
    assert refused.returncode != 0 and "was half made" not in refused.stderr
    assert _state(db) == "half"  # as it was: a store with runs is its owner's to repair (`mlflow db upgrade`)


def test_a_store_sqlite_cannot_read_is_set_aside_and_made_again(tmp_path) -> None:
    """A store of garbage (a torn copy) holds runs no one can read: it is renamed aside with one line naming it and
    where it went, and a new store is made, so the command runs."""
    db = tmp_path / "mlflow.db"
    assert _prepare(db).returncode == 0 and _state(db) == "whole"
    garbage = b"\x00\x17not a database\xff" * 100
    db.write_bytes(garbage)
    with pytest.raises(sqlite3.DatabaseError, match="not a database"):  # the fault
        with closing(sqlite3.connect(db)) as con:
            con.execute("SELECT 1 FROM sqlite_master").fetchall()
    repaired = _prepare(db)
    assert repaired.returncode == 0, repaired.stderr[-2000:]
    (aside,) = tmp_path.glob("mlflow.db.corrupt-*")
    assert _state(db) == "whole" and aside.read_bytes() == garbage
    assert f"MLflow store {db} is unreadable (DatabaseError: file is not a database): set aside as {aside.name}" in \
        repaired.stderr
