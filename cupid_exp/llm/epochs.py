"""Which epoch (``runtime.epochs``) the running unit's calls belong to: a context variable, unset with one epoch."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Mapping

EPOCH: ContextVar[int | None] = ContextVar("cupid_epoch", default=None)


def epoch_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The running epoch's seed (``seed`` or 0, plus the epoch), so each epoch is its own request; else nothing."""
    epoch = EPOCH.get()
    return {} if epoch is None else {"seed": int(params.get("seed") or 0) + epoch}
