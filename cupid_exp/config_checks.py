"""How a config is checked: the one-line ``ConfigError``, range helpers, unknown keys, the walk over every node."""

from __future__ import annotations

import difflib
import math
from dataclasses import MISSING, fields, is_dataclass
from typing import Callable, Mapping, Sequence

from cupid_exp.decoding_params import param_problem
from cupid_exp.errors import ConfigError
from cupid_exp.secrets import mask_url_credentials, url_credentials


def require(ok: bool, key: str, value: object, allowed: str) -> None:
    """Raise the one-line error every bad setting gets: which key, which value, what is allowed."""
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def require_positive(key: str, value: float | None, *, allow_none: bool = False, allow_zero: bool = False) -> None:
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and (
        value >= 0 if allow_zero else value > 0)
    bound = ">= 0" if allow_zero else "> 0"
    require(ok, key, value, f"a number {bound}" + (" or null" if allow_none else ""))


def require_int(key: str, value: object, low: int, *, allow_none: bool = False) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low or allow_none and value is None
    require(ok, key, value, f"an integer >= {low}" + (", or null" if allow_none else ""))


def require_no_credentials(key: str, url: str | None, instead: str) -> None:
    """Refuse a URL with credentials in it: it would be written wherever the setting goes (Hydra, MLflow, errors)."""
    if url and url_credentials(url):
        raise ConfigError(f"{key}={mask_url_credentials(url)!r} carries credentials in the URL (masked here), which "
                          f"would be written in clear; {instead}")


def check_params(params: Mapping[str, object], where: str) -> None:
    """Raise ConfigError for the first bad decoding parameter (``decoding_params``), naming ``<where>.<key>``."""
    for key, value in params.items():
        problem = param_problem(str(key), value, params)
        require(problem is None, f"{where}.{key}", value, problem or "")


class Checked:
    """A config node with value checks; ``check`` raises ConfigError naming ``where.<key>``."""

    def check(self, where: str) -> None:  # pragma: no cover - overridden
        pass


def check_known_keys(composed: object, node: object, where: str = "",
                     groups: dict[str, list[str]] | None = None,
                     moved: Callable[[str], str | None] = lambda key: None) -> None:
    """Reject keys a schema lacks: ``+calls.num_retry=3`` would otherwise be dropped silently. The hint is the key's
    new name where ``moved`` knows one (``+model.rpm=300``: ``model.pool.rpm``), else a close name, in the other
    groups too (``runtime.num_retries`` moved to ``calls`` when the call settings became a group)."""
    if not is_dataclass(node) or not hasattr(composed, "keys"):
        return
    names, prefix = [f.name for f in fields(node)], f"{where}." if where else ""
    if groups is None:  # the root: its groups' keys, for a key given in the wrong one
        groups = {f.name: [g.name for g in fields(v)] for f in fields(node) if is_dataclass(v := getattr(node, f.name))}
    for key in composed.keys():
        if key not in names:
            new_name = moved(f"{prefix}{key}")
            close = [new_name] if new_name else [
                f"{prefix}{c}" for c in difflib.get_close_matches(str(key), names, n=1)]
            for group, keys in ({} if close or "." in where else groups).items():
                close = close or [f"{group}.{c}" for c in difflib.get_close_matches(str(key), keys, n=1)]
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(f"{prefix}{key} is not a setting of "
                              f"{where or 'the config'}{hint} (known: {', '.join(names)})")
    for name in names:
        check_known_keys(composed.get(name), getattr(node, name), f"{prefix}{name}", groups, moved)


def not_read(key: str, group: str, options: Sequence[str]) -> ConfigError:
    """The line for a setting the group's chosen option does not read: the job would silently ignore it."""
    readers = ", ".join(f"{group}={o}" for o in options)
    return ConfigError(f"{key} is read only by {readers}; add {group}={options[0]}")


def read_only_by(option: str, **when: object) -> dict[str, object]:
    """Field metadata: read only when the node's fields hold ``when``; ``option`` is the choice that sets them."""
    return {"read_only_by": (option, when)}


def check_read(node: object, where: str) -> None:
    """Refuse a field of ``node`` set (unlike its default) where its ``read_only_by`` says it is not read."""
    for f in fields(node):
        option, when = f.metadata.get("read_only_by", (None, {}))
        if option is None or all(getattr(node, k) == v for k, v in when.items()):
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if getattr(node, f.name) != default:
            raise not_read(f"{where}.{f.name}", where.rsplit(".", 1)[-1], [option])


def check_tree(node: object, where: str = "") -> None:
    """Run ``check`` on every Checked node of a config tree, parents first, after ``check_read``."""
    if is_dataclass(node):  # every Checked node is one
        check_read(node, where)
        if isinstance(node, Checked):
            node.check(where)
        for f in fields(node):
            check_tree(getattr(node, f.name), f"{where}.{f.name}" if where else f.name)
    elif isinstance(node, dict):
        for key, value in node.items():
            if is_dataclass(value):
                check_tree(value, f"{where}.{key}")
