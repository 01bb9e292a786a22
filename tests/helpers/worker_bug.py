"""Settings that behave differently in a worker process (``runtime.workers``): one with a bug, one that logs.
The job's own process runs them as the standard setting; a worker imports this module when it unpickles the
config that names them."""

from __future__ import annotations

import logging
import multiprocessing
from dataclasses import dataclass

from cupid_exp.settings import SETTINGS, register
from cupid_exp.settings.standard import Standard, StandardConfig


@dataclass
class BugInWorkersConfig(StandardConfig):
    name: str = "bug_in_workers"


class BugInWorkers(Standard):
    name = "bug_in_workers"
    Config = BugInWorkersConfig

    async def view(self, instance, ctx, transcript):
        if multiprocessing.parent_process() is not None:
            raise TypeError("a bug only workers have")
        return await super().view(instance, ctx, transcript)


@dataclass
class LogsInWorkersConfig(StandardConfig):
    name: str = "logs_in_workers"


class LogsInWorkers(Standard):
    """The standard setting, which says where it ran each instance when that is a worker process."""

    name = "logs_in_workers"
    Config = LogsInWorkersConfig

    async def view(self, instance, ctx, transcript):
        if multiprocessing.parent_process() is not None:
            logging.getLogger("cupid_exp.tests").warning("instance %s ran in a worker", instance.key)
        return await super().view(instance, ctx, transcript)


def register_both() -> None:
    """Register both settings (a worker does so when it imports this module to unpickle its config)."""
    register(BugInWorkers)
    register(LogsInWorkers)


def unregister_both() -> None:
    """Keep them out of the test process's registry (the registry tests see the project's settings only)."""
    for cls in (BugInWorkers, LogsInWorkers):
        SETTINGS.pop(cls.name, None)


register_both()
