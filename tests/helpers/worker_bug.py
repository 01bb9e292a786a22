"""A setting that behaves differently in a worker process (``runtime.workers``): it logs there, or with
``bug=true`` raises there (``disk_full=true``: the ENOSPC of a full disk). The job's own process runs it as the
standard setting; a spawned worker imports this module
when it unpickles the work that holds it, a forked one registers it as it starts."""

from __future__ import annotations

import errno
import logging
import multiprocessing
import os
from dataclasses import dataclass

from cupid_exp.settings import SETTINGS, register
from cupid_exp.settings.standard import Standard, StandardConfig


@dataclass
class InWorkersConfig(StandardConfig):
    name: str = "in_workers"
    bug: bool = False  #: raise a TypeError in a worker, instead of logging that it ran there
    disk_full: bool = False  #: raise ENOSPC on a file in a worker (a usage ledger on a full disk)


class InWorkers(Standard):
    name = "in_workers"
    Config = InWorkersConfig

    async def view(self, instance, ctx, transcript):
        if multiprocessing.parent_process() is not None:
            if self.config.bug:
                raise TypeError("a bug only workers have")
            if self.config.disk_full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/full/usage/ledger.jsonl")
            logging.getLogger("cupid_exp.tests").warning("instance %s ran in a worker", instance.key)
        return await super().view(instance, ctx, transcript)


def unregister() -> None:
    """Keep it out of the test process's registry (the registry tests see the project's settings only)."""
    SETTINGS.pop(InWorkers.name, None)


register(InWorkers)  # a spawned worker needs it registered when it imports this module to unpickle its config
os.register_at_fork(after_in_child=lambda: register(InWorkers))  # a forked one inherits the test's registry
