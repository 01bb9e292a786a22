"""How many processes share a job's model calls: ``runtime.workers=auto`` (the default) chooses by the job's size.

Why: each call costs the client a few milliseconds of CPU, so a large job at high concurrency is bound by one
core, not by the backend (``job.workers``). A second process costs ~200 MB, and its share of the job's coordination
(each finished instance crosses to the job's process), which a small job never earns back (160 instances at
concurrency 32: +1 s of wall with two, measured when a worker was spawned and imported litellm again; on Linux it
is now forked after that import).
So ``auto`` adds a process only for API models, per ``INSTANCES_PER_PROCESS`` instances left and per
``SLOTS_PER_PROCESS`` slots of the least concurrent model, up to the cores this process may use; and it stays
at one where another process cannot help or cannot start: an embedded model (it would be loaded once per
process), ``runtime.batch`` (the job waits on the provider), a dry run, or a process that cannot spawn (joblib's
loky workers). An explicit ``runtime.workers=N`` is taken as given (bounded as before: ``job.workers``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os

from cupid_exp.config import AUTO_WORKERS, RunConfig

log = logging.getLogger(__name__)

INSTANCES_PER_PROCESS = 150  #: a process per this many instances left (~600 calls for inference, ~900 for both)
SLOTS_PER_PROCESS = 16  #: ... and per this many slots of the least concurrent model (fewer: one process keeps up)
SPAWNABLE = (None, "spawn", "fork", "forkserver")  #: start methods under which a spawned worker can start


def available_cores() -> int:
    """The cores this process may run on (its affinity: a SLURM allocation, ``taskset``), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def can_spawn() -> bool:
    """Whether this process can start a spawned worker (a joblib/loky worker's child would die at once)."""
    return multiprocessing.get_start_method(allow_none=True) in SPAWNABLE


def auto_processes(cfg: RunConfig, todo: int, cores: int | None = None) -> tuple[int, str]:
    """``runtime.workers=auto``: the processes for ``todo`` instances left, and why, in words for the log."""
    if cfg.runtime.dry_run:
        return 1, "a dry run calls no model"
    if cfg.runtime.batch:
        return 1, "runtime.batch waits on the provider, not on this process"
    embedded = cfg.embedded_model_names()
    if embedded:
        return 1, f"{', '.join(embedded)} run(s) inside the job's process"
    if not can_spawn():
        return 1, f"this process (start method {multiprocessing.get_start_method(allow_none=True)!r}) cannot spawn"
    cores = available_cores() if cores is None else cores
    slots = min(m.max_concurrency for m in cfg.model_configs())
    n = max(1, min(cores, todo // INSTANCES_PER_PROCESS, slots // SLOTS_PER_PROCESS))
    return n, (f"{todo} instances left (a process per {INSTANCES_PER_PROCESS}), {slots} slots of the least concurrent "
               f"model (a process per {SLOTS_PER_PROCESS}), {cores} cores")


def is_auto(cfg: RunConfig) -> bool:
    return cfg.runtime.workers == AUTO_WORKERS
