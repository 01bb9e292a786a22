"""The two CUPID tasks (paper §2.3), registered by name; ``task.parts`` lists the ones a job runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from cupid_exp.config import require
from cupid_exp.tasks.generation import run_generation
from cupid_exp.tasks.inference import run_inference


@dataclass(frozen=True)
class Task:
    name: str
    run: Callable[..., Awaitable[Any]]  #: (ctx, instance, view, transcript) -> its typed result
    headline: str  #: the metric a table leads with (paper: F1 for inference, judge score for generation)


TASKS: dict[str, Task] = {"inference": Task("inference", run_inference, "f1"),
                          "generation": Task("generation", run_generation, "score")}


def check_task_parts(parts: Sequence[str], where: str = "task.parts") -> None:
    """``task.parts``: distinct registered parts, else ConfigError (checked at planning, not in the schema)."""
    require(bool(parts) and set(parts) <= set(TASKS) and len(set(parts)) == len(parts), where, parts,
            f"a non-empty list of distinct parts from {sorted(TASKS)}")
