"""A SQLite tracking store made aside and renamed into place, since MLflow's migrations are not transactional."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
import uuid
from contextlib import closing
from pathlib import Path

from cupid_exp.aside import set_aside

log = logging.getLogger(__name__)

ASIDE_SUFFIX = ".creating"  #: a store being made: ``.<name>.<pid>-<random>.creating`` beside it


def aside_files(db: Path) -> list[Path]:
    return sorted(db.parent.glob(f".{db.name}.*{ASIDE_SUFFIX}*"))  # its -journal too


def clear_leftovers(db: Path) -> None:
    """Remove stores a killed process was making (the lock is held: nobody else is making one now)."""
    for path in aside_files(db):
        path.unlink(missing_ok=True)


def create_aside(db: Path) -> None:
    """Make a new store (MLflow's own schema, its Default experiment) beside ``db``, then move it into place."""
    from mlflow.tracking import MlflowClient

    aside = db.with_name(f".{db.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}{ASIDE_SUFFIX}")
    try:
        MlflowClient(f"sqlite:///{aside}").search_experiments(max_results=1)  # creates and migrates the schema
        forget_connections(f"sqlite:///{aside}")
        os.replace(aside, db)
    finally:
        for path in aside_files(db):
            path.unlink(missing_ok=True)


def forget_connections(uri: str) -> None:
    """Close MLflow's pooled connections to ``uri``'s file: they would outlive its rename."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    engine = getattr(SqlAlchemyStore, "_engine_map", {}).pop(uri, None)
    if engine is not None:
        engine.dispose()


def holds_nothing(db: Path) -> bool:
    """No run and no experiment but Default in it: nothing lost by remaking it."""
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as con:
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "runs" in tables and con.execute("SELECT 1 FROM runs LIMIT 1").fetchone():
                return False
            return not ("experiments" in tables and con.execute(
                "SELECT 1 FROM experiments WHERE experiment_id != 0 LIMIT 1").fetchone())
    except sqlite3.Error:
        return False  # not a database we can read: not ours to replace


def unreadable(db: Path) -> sqlite3.DatabaseError | None:
    """SQLite's error when ``db`` is no database at all; else None (locks, permissions: not the file)."""
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as con:
            con.execute("SELECT name FROM sqlite_master").fetchall()
    except sqlite3.OperationalError:
        return None
    except sqlite3.DatabaseError as exc:
        return exc
    return None


def repair(db: Path, error: BaseException) -> bool:
    """Remake a store MLflow could not open when unreadable or empty (True); else leave it (False)."""
    if not db.exists():
        return False
    corrupt = unreadable(db)
    if corrupt is not None:
        forget_connections(f"sqlite:///{db}")
        set_aside(db, "MLflow store", corrupt, "a new store is made and this job's run starts in it (the runs the "
                  "old one held stay in the file set aside)", companions=("-wal", "-shm", "-journal"))
        create_aside(db)
        return True
    if not holds_nothing(db):
        return False
    broken = db.with_name(f"{db.name}.half-made-{time.strftime('%Y%m%d-%H%M%S')}")
    forget_connections(f"sqlite:///{db}")  # the failed open's: they would read the moved file on
    os.replace(db, broken)
    first = (str(error).strip().splitlines() or [""])[0][:200]
    log.warning("MLflow store %s was half made (%s: %s) and held no run: moved to %s and made again", db,
                type(error).__name__, first, broken.name)
    create_aside(db)
    return True
