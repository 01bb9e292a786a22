"""The two CUPID tasks (paper §2.3), registered by name; ``task.parts`` lists the ones a job runs."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Sequence

from cupid_exp.config import require
from cupid_exp.tasks.generation import run_generation
from cupid_exp.tasks.inference import run_inference

#: part -> its run: (ctx, instance, view, transcript) -> its typed result (the headline metric a table leads with is
#: ``scoring.statistics.HEADLINE``'s)
TASKS: dict[str, Callable[..., Awaitable[Any]]] = {"inference": run_inference, "generation": run_generation}


def check_task_parts(parts: Sequence[str], where: str = "task.parts") -> None:
    """``task.parts``: distinct registered parts, else ConfigError (checked at planning, not in the schema)."""
    require(bool(parts) and set(parts) <= set(TASKS) and len(set(parts)) == len(parts), where, parts,
            f"a non-empty list of distinct parts from {sorted(TASKS)}")
