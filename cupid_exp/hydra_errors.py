"""Hydra's composition errors (a misspelt key, a wrong type, an unknown choice) as one line of our own.

Hydra prints them itself, in 7-25 lines (the key's schema class, its reference type, every option of the group,
the config search path, a hint about HYDRA_FULL_ERROR), and exits. Until a job starts, what is written to stderr
is held (``HeldStderr``); if composition fails, ``one_line`` keeps what names the problem. A traceback (a bug
before the job, in a callback) is passed on whole, and ``HYDRA_FULL_ERROR=1`` turns the holding off: Hydra's
full text and its stack trace.
"""

from __future__ import annotations

import io
import re
import sys
from typing import Callable, TextIO

_NOISE = (re.compile(r"^\s*(full_key|reference_type|object_type|key|parent_node)[:=]"),
          re.compile(r"^Set the environment variable HYDRA_FULL_ERROR=1"))
_HINT = re.compile(r"^To append to your config use (\S+)$")


class HeldStderr(io.TextIOBase):
    """Stands in for ``sys.stderr`` and keeps what is written, until ``release`` puts the real stream back."""

    def __init__(self, real: TextIO):
        self.real = real
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def isatty(self) -> bool:
        return self.real.isatty()

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def release(self, *, replay: bool = True, clean: Callable[[str], str] = str) -> None:
        """The real stream back in ``sys.stderr``; what was held is written to it (through ``clean``: without the
        secrets of the command line) unless ``replay`` is off."""
        if sys.stderr is self:
            sys.stderr = self.real
        if replay and self.parts:
            self.real.write(clean(self.text))
            self.real.flush()
        self.parts = []


class ScrubbedStderr(io.TextIOBase):
    """``sys.stderr`` through ``clean``: a sweep's output as it happens, without the command line's secrets (Hydra's
    refusal of one job's override quotes it)."""

    def __init__(self, real: TextIO, clean: Callable[[str], str]):
        self.real, self.clean = real, clean

    def write(self, text: str) -> int:
        self.real.write(self.clean(text))
        return len(text)

    def flush(self) -> None:
        self.real.flush()

    def isatty(self) -> bool:
        return self.real.isatty()

    def fileno(self) -> int:
        return self.real.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.real.encoding


def one_line(text: str) -> str | None:
    """Hydra's error text in one line: what failed and the key's schema, the group's options folded in, the hint
    to append a new key last; None for a traceback (it is shown whole)."""
    if "Traceback (most recent call last)" in text:
        return None
    kept, options, hint = [], [], None
    in_options = in_search_path = False
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or any(p.match(line) for p in _NOISE):
            continue
        if line.startswith("Config search path:"):
            in_search_path, in_options = True, False
            continue
        if line.startswith("Available options in"):
            in_options, in_search_path = True, False
            continue
        if raw.startswith(("\t", "    ")) and (in_options or in_search_path):
            if in_options:
                options.append(line.strip())
            continue
        in_options = in_search_path = False
        if match := _HINT.match(line):
            hint = match.group(1)
            continue
        kept.append(line.strip().rstrip("."))
    if not kept:
        return None
    said = ": ".join(kept)
    if options:
        said += f" (choose one of: {', '.join(options)})"
    if hint:
        said += f" (a new key: {hint})"
    return said + "; HYDRA_FULL_ERROR=1 shows Hydra's full message"
