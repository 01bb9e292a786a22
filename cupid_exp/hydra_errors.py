"""Hydra's composition errors (a misspelt key, a wrong type, an unknown choice) as one line of our own.

Hydra prints them in 7-25 lines. Until a job starts stderr is held (``HeldStderr``); if composition fails,
``one_line`` keeps what names the problem. A traceback passes whole, and ``HYDRA_FULL_ERROR=1`` turns the holding
off. An override of a key only another option of its group has is said as such (``unread_override``).
"""

from __future__ import annotations

import io
import re
import sys
from typing import Callable, Sequence, TextIO

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


def _has(node: object, key: str) -> bool:
    """Whether the plain config ``node`` has the dotted ``key`` (a null parent has none of its keys)."""
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def unread_override(overrides: Sequence[str], config_name: str) -> str | None:
    """After a composition failed: the one line (``config_checks.not_read``) for the first ``group.key=value``
    override whose key the group's chosen option does not have but other options of the group do
    (``setting.top_k`` beside ``setting=standard``, ``model.local.n_threads`` beside an API model); None when no
    override is such (Hydra's own message then says what failed).

    Each option is composed once, with the command's choices: this runs only on the way out of a failure."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from cupid_exp.config_checks import not_read
    from cupid_exp.resources import conf_dir

    groups = {p.name for p in conf_dir().iterdir() if p.is_dir() and p.name != "hydra"}
    context: dict[str, str] = {}  # the command's choices (a sweep's first value), presets included
    dotted = []
    for override in overrides:
        key, _, value = override.partition("=")
        if override.startswith(("-", "~")) or not value or key.startswith(("hydra", "+hydra")):
            continue
        if "." not in key:
            context[key] = value.split(",")[0]
        elif key.split(".", 1)[0] in groups:
            dotted.append(key)

    def composed(group: str, option: str | None) -> object:
        picked = {**context, **({group: option} if option else {})}
        if GlobalHydra.instance().is_initialized():
            GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose(config_name, overrides=[f"{g}={o}" for g, o in picked.items()])
        return OmegaConf.to_container(cfg, resolve=False)

    try:
        for key in dotted:
            group = key.split(".", 1)[0]
            if _has(composed(group, None), key):
                continue  # the chosen option has the key: the failure is another one
            options = sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))
            readers = [option for option in options if _has(composed(group, option), key)]
            if readers:
                return str(not_read(key, group, readers))
    except Exception:  # noqa: BLE001 - the choices themselves do not compose: Hydra's message says why
        return None
    return None
