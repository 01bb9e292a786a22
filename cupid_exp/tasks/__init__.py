"""The two CUPID tasks (paper §2.3), registered by name; ``task.parts`` lists the ones a job runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from cupid_exp.tasks.context import TaskContext
from cupid_exp.tasks.generation import run_generation
from cupid_exp.tasks.inference import run_inference


@dataclass(frozen=True)
class Task:
    name: str
    run: Callable[..., Awaitable[Any]]  #: (ctx, instance, view, transcript) -> its typed result
    headline: str  #: the metric a table leads with (paper: F1 for inference, judge score for generation)


TASKS: dict[str, Task] = {"inference": Task("inference", run_inference, "f1"),
                          "generation": Task("generation", run_generation, "score")}

__all__ = ["TASKS", "Task", "TaskContext", "run_generation", "run_inference"]
