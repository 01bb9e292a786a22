"""A provider's cap on enqueued batch tokens, learnt from its rejection (a batch that fails no row), and batches sized
under it. Our counts are estimates, so a rejection with none of ours queued halves the share aimed for."""

from __future__ import annotations

import bisect
import itertools
import re
import time
from dataclasses import dataclass, field

from cupid_exp.llm.billing import field_of

TOKEN_LIMIT_CODE = "token_limit_exceeded"
MARGIN = 0.9  #: of the stated limit: our token estimate and the provider's count never agree exactly
_LIMIT = re.compile(r"limit:\s*([\d,_]+)\s*enqueued tokens", re.IGNORECASE)


def batch_errors(batch: object) -> list[tuple[str | None, str]]:
    """(code, message) of each error a failed batch carries (litellm's object or a plain dict)."""
    data = field_of(getattr(batch, "errors", None), "data")
    return [(field_of(e, "code"), str(field_of(e, "message") or "")) for e in data or []]


def token_limit_rejection(batch: object) -> tuple[int | None, str] | None:
    """(stated limit, message) for a batch rejected for the enqueued-token limit; None for other failures."""
    for code, message in batch_errors(batch):
        if code == TOKEN_LIMIT_CODE or "enqueued token limit" in message.lower():
            match = _LIMIT.search(message)
            limit = int(match.group(1).replace(",", "").replace("_", "")) if match else None
            return limit, " ".join(message.split())
    return None


@dataclass
class EnqueuedTokens:
    """What this job's batches hold in the provider's queue, and how many more tokens fit (once a limit is known)."""

    limit: int | None = None  #: the provider's stated limit (None until a rejection names it)
    share: float = MARGIN  #: of the limit that our batches aim to fill, halved by a rejection while none is queued
    in_flight: dict[str, int] = field(default_factory=dict)  #: batch id -> its estimated tokens
    held_since: float | None = None  #: monotonic time of the first rejection with no batch accepted since

    def finished(self, batch_id: str, accepted: bool) -> None:
        self.in_flight.pop(batch_id, None)
        if accepted:
            self.held_since = None

    def rejected(self, batch_id: str, limit: int | None) -> None:
        """Learn the limit; rejected with nothing of ours queued means our estimate ran short: aim lower."""
        self.in_flight.pop(batch_id, None)
        self.limit = limit or self.limit or 0
        if not self.in_flight:
            self.share = max(self.share / 2, 1e-6)
        self.held_since = self.held_since if self.held_since is not None else time.monotonic()

    def held_s(self) -> float:
        return 0.0 if self.held_since is None else time.monotonic() - self.held_since

    def fitting(self, tokens: list[int]) -> int:
        """How many next rows fit the next batch under the known limit (all without one; one at least if idle)."""
        if self.limit is None:
            return len(tokens)
        room = self.limit * self.share - sum(self.in_flight.values())
        n = bisect.bisect_right(list(itertools.accumulate(tokens)), room)  # counts: their running sums only grow
        return n if n or self.in_flight else min(1, len(tokens))
