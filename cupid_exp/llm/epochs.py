"""Which epoch (``runtime.epochs``) the running unit's calls belong to: a context variable, unset with one epoch."""

from __future__ import annotations

from contextvars import ContextVar

EPOCH: ContextVar[int | None] = ContextVar("cupid_epoch", default=None)
