"""MLflow's own error logs, one line each.

When its store fails (a full disk under a SQLite store, a server that went away) MLflow logs each error with its
SQL, parameters and traceback, then raises it, or drops a trace and logs again for the next one: thousands of
lines for one cause. The error that stops the job is reported by the job itself; what MLflow logs is kept to
the first line of each message, each distinct line once.
"""

from __future__ import annotations

import logging

MAX_CHARS = 300


class OneLineOnce(logging.Filter):
    """For MLflow's warnings and errors: the message's first line (with the exception's type and first line), once."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not (record.name == "mlflow" or record.name.startswith("mlflow.")):
            return True  # (on the root's handlers too: every other logger's records pass as they are)
        decided = getattr(record, "cupid_shown", None)  # one record reaches several handlers: decided once
        if decided is not None:
            return decided
        record.cupid_shown = self._shown(record)
        return record.cupid_shown

    def _shown(self, record: logging.LogRecord) -> bool:
        line = _first_line(record.getMessage())
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            line = f"{line} ({type(exc).__name__}: {_first_line(str(exc))})"
        line = line[:MAX_CHARS]
        if line in self.seen:
            return False
        self.seen.add(line)
        record.msg, record.args, record.exc_info, record.exc_text, record.stack_info = line, None, None, None, None
        return True


def _first_line(text: str) -> str:
    lines = [part for part in text.strip().splitlines() if part.strip()]
    return lines[0].strip() if lines else ""


_FILTER = OneLineOnce()


def install() -> None:
    """On the handlers MLflow's messages reach (its own logger's, and the root's); idempotent."""
    logger = logging.getLogger("mlflow")
    handlers = list(logger.handlers) + (list(logging.getLogger().handlers) if logger.propagate else [])
    for handler in handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
