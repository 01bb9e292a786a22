"""Job outputs written atomically, and the environment's failures told apart from our bugs: a full disk, read-only file
system or forbidden path ends the job in one line (exit 5). A vanished folder counts only under ``writing``."""

from __future__ import annotations

import errno
import json
import os
import re
import sqlite3
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from cupid_exp.errors import causes

_NOT_IN_A_NAME = re.compile(r"[/\\\x00-\x1f]")  # a path separator (either OS's) or a control character


def folder_name(*parts: object) -> str:
    """Config values joined by '_' as one folder name; separators become '_', so no value escapes the output root."""
    return "_".join(_NOT_IN_A_NAME.sub("_", str(part)) for part in parts)


#: What an OSError's errno must be for the environment to be blamed wherever it is raised.
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


class EnvironmentFailure(Exception):
    """The machine failed the job's files: ``path`` and the error, in one line."""

    def __init__(self, path: str | os.PathLike[str] | None, error: OSError):
        self.path, self.error = path, error
        name = errno.errorcode.get(error.errno or 0, "")
        where = f"{path}: " if path else ""
        super().__init__(f"environment failure: {where}{error.strerror or error} [{name}]; the journal keeps what "
                         "finished: free the space or fix the folder, then run the same command again to resume")


def environment_failure(exc: BaseException) -> EnvironmentFailure | None:
    """The environment failure behind ``exc`` (or its cause or context), preferring one that names the path."""
    unnamed: EnvironmentFailure | None = None
    for current in causes(exc):
        if isinstance(current, EnvironmentFailure):
            return current
        if isinstance(current, OSError) and current.errno in ENVIRONMENT_ERRNOS:
            if current.filename:
                return EnvironmentFailure(current.filename, current)
            unnamed = unnamed or EnvironmentFailure(None, current)
    return unnamed


#: SQLite's own message for SQLITE_FULL (the same under every Python; ``sqlite_errorcode`` is 3.11's)
_SQLITE_FULL = "database or disk is full"


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Around our writes under ``path``: environment errors and a vanished folder become ``EnvironmentFailure``."""
    try:
        yield
    except OSError as exc:
        if exc.errno in ENVIRONMENT_ERRNOS or exc.errno == errno.ENOENT:
            raise EnvironmentFailure(path, exc) from exc
        raise
    except sqlite3.OperationalError as exc:
        if _SQLITE_FULL in str(exc):
            raise EnvironmentFailure(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))) from exc
        raise


def atomic_write_text(path: Path, text: str) -> None:
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def write_json(path: Path, payload: object) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2, ensure_ascii=False, default=str) + "\n")
