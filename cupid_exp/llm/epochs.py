"""Which epoch (``runtime.epochs``: a repeated run of an instance) the calls of the running unit belong to.

Set by the unit's run for the calls it makes (a context variable: each unit's calls see their own, whichever lane,
process or Batch API row sends them); unset with one epoch, so a one-epoch job sends what it always sent.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Mapping

EPOCH: ContextVar[int | None] = ContextVar("cupid_epoch", default=None)


def epoch_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The seed of the running epoch (the model's ``seed``, 0 without one, plus the epoch: 0, 1, ...), where an
    epoch runs: another seed is another request, so another response-cache entry, and a provider that takes a seed
    draws anew (one that does not has it dropped by litellm: ``drop_params``). Nothing outside an epoch."""
    epoch = EPOCH.get()
    if epoch is None:
        return {}
    return {"seed": int(params.get("seed") or 0) + epoch}
