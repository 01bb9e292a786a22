"""A per-instance log of model calls, for tracing: who asked what, what came back, and what it cost.

``ask`` appends a ``CallRecord`` per attempt to the log of the current context (``recording``, opened around each
instance and inherited by its child tasks). With no log open it costs one ContextVar lookup; spans are built
from the log after the instance, off the call path.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

from cupid_exp.llm.messages import Message


class Rejection(NamedTuple):
    """Why an attempt's reply was not used: a provider failure's kind, or the parse failure's (unparseable,
    truncated, ...), with its message."""

    kind: str
    message: str


@dataclass
class CallRecord:
    """One attempt of one step: a completion, a provider failure, or a reply that could not be used."""

    step: str
    attempt: int  #: 0 for the first request, 1.. for re-asks / resamples and a cut reply's longer request
    model: str  #: the model config's name
    litellm_model: str
    messages: list[Message]
    started_ns: int  #: wall clock (epoch ns) when the call was made
    ended_ns: int
    reply: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    cached: bool = False
    retries: int = 0
    finish_reason: str | None = None
    rejected: Rejection | None = None  #: None for a reply that was used


@dataclass
class CallLog:
    """The calls of one instance, in the order they ended."""

    started_ns: int = field(default_factory=time.time_ns)
    calls: list[CallRecord] = field(default_factory=list)


_CURRENT: ContextVar[CallLog | None] = ContextVar("cupid_call_log", default=None)


def current() -> CallLog | None:
    return _CURRENT.get()


@contextmanager
def recording(enabled: bool = True) -> Iterator[CallLog | None]:
    """Open a call log for the code (and the tasks it starts) inside the block; None when disabled."""
    if not enabled:
        yield None
        return
    log = CallLog()
    token = _CURRENT.set(log)
    try:
        yield log
    finally:
        _CURRENT.reset(token)
