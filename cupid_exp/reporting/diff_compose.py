"""Composing a config as ``python -m cupid_exp`` would, and values and differences in Hydra's override grammar."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from hydra.core.override_parser.types import Quote, QuotedString
from omegaconf import DictConfig, OmegaConf

from cupid_exp.reporting.diff_specs import job_choices, resolved
from cupid_exp.secrets import redact

REDACTED = "***"
_UNQUOTED = re.compile(r"^[A-Za-z_/][\w\-./@:+]*$")
_KEYWORDS = {"true", "false", "null", "none", "nan", "inf", "-inf", "+inf"}
_MISSING = object()


@dataclass
class Composed:
    resolved: dict[str, Any]
    unresolved: DictConfig
    choices: dict[str, str]

    def derived(self, key: str) -> bool:
        """True when the value at dotted ``key`` follows from another by interpolation."""
        parent, _, leaf = key.rpartition(".")
        try:
            node = OmegaConf.select(self.unresolved, parent) if parent else self.unresolved
            return isinstance(node, DictConfig) and OmegaConf.is_interpolation(node, leaf)
        except Exception:  # a parent that cannot be resolved: treat the key as a source
            return False


def compose(overrides: Sequence[str], conf_dir: str | Path | None = None) -> Composed:
    """Compose ``conf/config.yaml`` with ``overrides`` as ``python -m cupid_exp`` would (no hydra key)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from cupid_exp.config_store import register_configs

    if conf_dir is None:
        from cupid_exp.resources import conf_dir as shipped_conf

        conf_dir = shipped_conf()
    register_configs()
    if GlobalHydra.instance().is_initialized():  # e.g. called from inside a Hydra app
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
    choices = job_choices(OmegaConf.to_container(cfg.hydra.runtime.choices))
    OmegaConf.set_struct(cfg, False)
    del cfg["hydra"]
    return Composed(redact(resolved(cfg)), cfg, choices)


def _quote(text: str) -> str:
    """Hydra's single-quoted string: quotes escaped, and the backslashes before a quote or the end doubled."""
    return QuotedString(text=text, quote=Quote.single).with_quotes()


def format_value(value: object) -> str:
    """A Python value in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{_key(k)}:{format_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    text = str(value)
    if _UNQUOTED.match(text) and text.lower() not in _KEYWORDS and "${" not in text:
        return text
    return _quote(text)


def _key(key: object) -> str:
    k = str(key)
    return k if re.match(r"^[A-Za-z_][\w\-]*$", k) else _quote(k)


def same(a: object, b: object) -> bool:
    """Equal as config values: a bool is not 1, NaN equals NaN, containers compare element by element."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=False))
    return a == b


@dataclass(frozen=True)
class LeafDiff:
    key: str
    op: str  # set | add | remove
    value: object = None

    def override(self) -> str:
        if self.op == "remove":
            return f"~{self.key}"
        return f"{'+' if self.op == 'add' else ''}{self.key}={format_value(self.value)}"


def leaf_diffs(current: Mapping[str, Any], target: Mapping[str, Any], prefix: str = "") -> list[LeafDiff]:
    """What to set on ``current`` to reach ``target`` (dicts recurse, lists whole, redacted values never compared)."""
    out: list[LeafDiff] = []
    for key in list(current) + [k for k in target if k not in current]:
        path = f"{prefix}{key}"
        a, b = current.get(key, _MISSING), target.get(key, _MISSING)
        if a == REDACTED or b == REDACTED:
            continue
        if b is _MISSING:
            out.append(LeafDiff(path, "remove"))
        elif a is _MISSING:
            out.append(LeafDiff(path, "add", b))
        elif isinstance(a, Mapping) and isinstance(b, Mapping):
            out.extend(leaf_diffs(a, b, f"{path}."))
        elif not same(a, b):
            out.append(LeafDiff(path, "set", b))
    return out


