"""A failing tracking store: the environment's (exit 5, never asked again) or what was sent (``TrackingError``)."""

from __future__ import annotations

import re

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
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current).strip()
        name = type(current).__name__
        if name == "MlflowException" and _UNREACHABLE.match(text) or name in _CONNECTION_CLASSES:
            return True
        if name == "OperationalError" and any(s in text.lower() for s in _SQLITE_UNUSABLE):
            return True
        current = current.__cause__ or current.__context__
    return False
