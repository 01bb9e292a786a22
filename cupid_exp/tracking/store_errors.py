"""A failing tracking store: the environment's (exit 5, never asked again) or what was sent (``TrackingError``); and
MLflow's error logs about it, one line each, in the job's log file only (a failing store floods the console)."""

from __future__ import annotations

import logging
import re

from cupid_exp.errors import causes, first_line
from cupid_exp.outputs import EnvironmentFailure, environment_failure


class TrackingError(RuntimeError):
    """The MLflow run could not be opened or logged (the store's error, as the worker saw it)."""


class TrackingUnavailable(TrackingError, EnvironmentFailure):
    """The tracking store is unreachable: exit 5 in one line; the same command publishes later."""

    def __init__(self, message: str):
        RuntimeError.__init__(self, f"environment failure: {message}")
        self.path, self.error = None, None


# MLflow's own words for a store it could not reach (``mlflow.utils.rest_utils``): no connection, a timeout, or a
# server error after its retries; a SQLite store that is locked, unreadable or on a failing disk.
_UNREACHABLE = re.compile(r"^API request to (endpoint )?\S+ failed with (exception|timeout exception|error code 5\d\d)")
_SQLITE_UNUSABLE = ("database is locked", "unable to open database", "disk i/o error", "database or disk is full",
                    "readonly database")
_CONNECTION_CLASSES = {"ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout", "MaxRetryError",
                       "NewConnectionError", "ProtocolError", "RemoteDisconnected"}


def store_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) says the store is unreachable or unwritable, not that it refused."""
    if environment_failure(exc) is not None:
        return True
    for current in causes(exc):
        text, name = str(current).strip(), type(current).__name__
        if name == "MlflowException" and _UNREACHABLE.match(text) or name in _CONNECTION_CLASSES:
            return True
        if name == "OperationalError" and any(s in text.lower() for s in _SQLITE_UNUSABLE):
            return True
    return False


STORE_NOTE = {"cupid_store": True}  #: ``extra=`` of the job's own warnings about a failing store


def _about_the_store(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING and (
        record.name == "mlflow" or record.name.startswith("mlflow.") or getattr(record, "cupid_store", False))


class OneLineOnce(logging.Filter):
    """For MLflow's warnings and errors: the message's first line (with the exception's type and first line), once."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not _about_the_store(record):
            return True  # (on the root's handlers too: every other logger's records pass as they are)
        decided = getattr(record, "cupid_shown", None)  # one record reaches several handlers: decided once
        if decided is None:
            decided = record.cupid_shown = self._shown(record)
        return decided

    def _shown(self, record: logging.LogRecord) -> bool:
        line = first_line(record.getMessage(), None)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            line = f"{line} ({type(exc).__name__}: {first_line(exc, None)})"
        line = line[:300]
        if line in self.seen:
            return False
        self.seen.add(line)
        record.msg, record.args, record.exc_info, record.exc_text, record.stack_info = line, None, None, None, None
        return True


class OffTheConsole(logging.Filter):
    """On a console handler: store notes go to the root's log files (MLflow's logger does not propagate)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _about_the_store(record):
            return True
        if not getattr(record, "cupid_filed", False) and not _propagates_to_root(record.name):
            record.cupid_filed = True
            for handler in logging.getLogger().handlers:
                if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
                    handler.handle(record)
        return False


def _propagates_to_root(name: str) -> bool:
    logger = logging.getLogger(name)
    while logger.propagate and logger.parent is not None:
        logger = logger.parent
    return logger.parent is None  # (stopped short of the root: a logger that does not propagate)


_FILTER, _CONSOLE = OneLineOnce(), OffTheConsole()


def install() -> None:
    """On MLflow's and the root's handlers; idempotent, called again once Hydra configures logging."""
    for handler in [*logging.getLogger("mlflow").handlers, *logging.getLogger().handlers]:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
        console = isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
        if console and _CONSOLE not in handler.filters:
            handler.addFilter(_CONSOLE)
