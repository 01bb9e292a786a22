"""Synthetic CUPID data sets: the 9-row sample under new persona ids, perturbed so prompts differ."""

from __future__ import annotations

import copy
import functools
import json
import operator
from pathlib import Path
from typing import Any, Callable

from cupid_exp.data.loading import SAMPLE_FULL_PATH


def sample_rows() -> list[dict[str, Any]]:
    """The 9 rows of the full sample (the demo's ``data=sample`` is its first 3)."""
    return [json.loads(line) for line in SAMPLE_FULL_PATH.read_text(encoding="utf-8").splitlines() if line.strip()]


def make_rows(n: int, *, start: int = 100) -> list[dict[str, Any]]:
    """``n`` valid rows: sample rows in turn, persona ids ``<start+i>+<role>``, requests made unique."""
    base = sample_rows()
    rows = []
    for i in range(n):
        row = copy.deepcopy(base[i % len(base)])
        role = row["persona_id"].split("+", 1)[-1]
        row["persona_id"] = f"{start + i}+{role}"
        row["current_request"] += f" (variant {i})"
        row["prior_interactions"][0]["dialogue"][0]["content"] += f" [case {i}]"
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def write_dataset(path: Path, n: int, *, start: int = 100) -> Path:
    return write_jsonl(path, make_rows(n, start=start))


def stub_overrides(url: str, litellm_model: str = "openai/stub") -> list[str]:
    """Overrides sending every role to the stub at ``url`` (``null``: the in-process ``litellm_model``)."""
    out = ["model=openai_compatible", f"model.litellm_model={litellm_model}", f"model.api_base={url}",
           "evaluator=local"]
    for role in ("decomposer", "matcher", "judge"):
        out += [f"llm@evaluator.{role}=openai_compatible", f"evaluator.{role}.litellm_model={litellm_model}",
                f"evaluator.{role}.api_base={url}"]
    return out


def _mutation(path: list, change: Callable[[Any, Any], None]) -> Callable[[dict], dict]:
    """A row mutation for bad-input tests: ``change(container, key)`` at ``path`` (keys and list indices), in place."""
    def apply(row: dict) -> dict:
        change(functools.reduce(operator.getitem, path[:-1], row), path[-1])
        return row
    return apply


def set_at(path: list, value: Any) -> Callable[[dict], dict]:
    return _mutation(path, lambda target, key: operator.setitem(target, key, value))


def delete_at(path: list) -> Callable[[dict], dict]:
    return _mutation(path, operator.delitem)
