"""Hydra's composition errors as one line of our own: stderr is held until a job starts (``HeldStderr``), and on failure
``one_line`` keeps what names the problem. A traceback passes whole; ``HYDRA_FULL_ERROR=1`` disables it."""

from __future__ import annotations

import contextlib
import io
import re
import sys
from typing import Callable, Sequence, TextIO

_NOISE = (re.compile(r"^\s*(full_key|reference_type|object_type|key|parent_node)[:=]"),
          re.compile(r"^Set the environment variable HYDRA_FULL_ERROR=1"))
_HINT = re.compile(r"^To append to your config use (\S+)$")
_MERGED = re.compile(r"^Error merging override (\S+)")


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
        """The real stream back; what was held is replayed through ``clean`` unless ``replay`` is off."""
        if sys.stderr is self:
            sys.stderr = self.real
        if replay and self.parts:
            self.real.write(clean(self.text))
            self.real.flush()
        self.parts = []


class ScrubbedStderr(io.TextIOBase):
    """``sys.stderr`` through ``clean``: a sweep's output live, without the command line's secrets."""

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


def one_line(text: str, moved: Callable[[str], str | None] = lambda key: None) -> str | None:
    """Hydra's error in one line (what failed, the options, the hint for a new key, or the key's new name where
    ``moved`` knows one: old dotted key -> new); None for a traceback."""
    if "Traceback (most recent call last)" in text:
        return None
    kept, options, hint = [], [], None
    listed: list[str] | None = None  # under "Available options in" or "Config search path:" (dropped): its lines
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or any(p.match(line) for p in _NOISE):
            continue
        if line.startswith(("Config search path:", "Available options in")):
            listed = options if line.startswith("Available") else []
            continue
        if raw.startswith(("\t", "    ")) and listed is not None:
            listed.append(line.strip())
            continue
        listed = None
        if match := _HINT.match(line):
            hint = match.group(1)
            continue
        kept.append(line.strip().rstrip("."))
    if not kept:
        return None
    said = ": ".join(kept)
    if options:
        said += f" (choose one of: {', '.join(options)})"
    # a key that moved: Hydra's hint to add it anew, or a value given to what became a group (``model.pool=x``)
    merged = _MERGED.match(text) if "is not a subclass of" in text else None
    key, _, value = (hint or (merged.group(1) if merged else "")).removeprefix("+").partition("=")
    if key and (new := moved(key)):
        said += f" (moved: {new}={value})" if value else f" (moved: {new})"
    elif hint:
        said += f" (a new key: {hint})"
    return said + "; HYDRA_FULL_ERROR=1 shows Hydra's full message"


def hydra_text(exc: BaseException | None) -> str:
    """What Hydra prints for a composition error it caught: the error, and OmegaConf's under it."""
    from omegaconf.errors import OmegaConfBaseException

    cause = exc.__cause__ if exc is not None else None
    return f"{exc}\n{cause}" if isinstance(cause, OmegaConfBaseException) else str(exc)


def _has(node: object, key: str) -> bool:
    """Whether the plain config ``node`` has the dotted ``key`` (a null parent has none of its keys)."""
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def unread_override(overrides: Sequence[str], config_name: str) -> str | None:
    """After a failed composition: the ``not_read`` line for the first override whose key only another option of its
    group has (``setting.top_k`` beside ``setting=standard``); None if none is."""
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

    with contextlib.suppress(Exception):  # the choices themselves do not compose: Hydra's message says why
        for key in dotted:
            group = key.split(".", 1)[0]
            if _has(composed(group, None), key):
                continue  # the chosen option has the key: the failure is another one
            options = sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))
            readers = [option for option in options if _has(composed(group, option), key)]
            if readers:
                return str(not_read(key, group, readers))
    return None
