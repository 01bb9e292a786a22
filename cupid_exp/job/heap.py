"""The garbage collector kept off the start-up and off the long-lived objects while units run.

A calls process loads litellm, the OpenAI SDK, pydantic's models, Hydra and the plan: a few hundred thousand
objects that live as long as it does. Measured on 756 instances at 64 in flight (2026-11-27, the job's process):
loading them set off 7 full (generation 2) collections, 0.55 s of the start-up, that found next to nothing
to free; and while the units ran, each full collection walked them again: 9 passes, 1.0 s in all, the longest
250 ms, each a stall of the event loop while replies waited. So collections are paused from the job's start
(``start_up``) until its units run, and then the objects alive at that moment are frozen (``gc.freeze``, what
CPython's documentation advises before a fork too) until the units are done: garbage made meanwhile is
collected as usual, and a sweep's next job in this process can collect what this one left.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def start_up() -> Iterator[None]:
    """No collections while the job loads its modules and plans (``long_lived_frozen`` turns them back on for
    the units); on, as before, once the job is over."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def long_lived_frozen() -> Iterator[None]:
    """Collections on; the objects alive on entry are skipped by every one of them until exit."""
    gc.freeze()
    gc.enable()
    try:
        yield
    finally:
        gc.unfreeze()
