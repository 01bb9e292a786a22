"""The garbage collector kept off start-up and off the long-lived objects while units run, where full collections free
next to nothing and stall the event loop (bench/versus_official.md): paused, then ``gc.freeze`` until units end."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def start_up() -> Iterator[None]:
    """No collections while the job loads and plans; on again once it is over."""
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
