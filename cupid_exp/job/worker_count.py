"""How many processes share a job's calls: ``auto`` adds one for API models per ``INSTANCES_PER_PROCESS`` units and
``SLOTS_PER_PROCESS`` slots, up to the cores (a small job never earns a process back); else one."""

from __future__ import annotations

import logging
import multiprocessing
import os

from cupid_exp.config import AUTO_WORKERS, JobConfig

log = logging.getLogger(__name__)

INSTANCES_PER_PROCESS = 150  #: a process per this many instances left (~600 calls for inference, ~900 for both)
SLOTS_PER_PROCESS = 16  #: ... and per this many slots of the least concurrent model (fewer: one process keeps up)
SPAWNABLE = (None, "spawn", "fork", "forkserver")  #: start methods under which a spawned worker can start


def available_cores() -> int:
    """The cores this process may run on (its affinity: a SLURM allocation, ``taskset``), else the machine's."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def can_spawn() -> bool:
    """Whether this process can start a spawned worker (a joblib/loky worker's child would die at once)."""
    return multiprocessing.get_start_method(allow_none=True) in SPAWNABLE


def auto_processes(cfg: JobConfig, todo: int, cores: int | None = None, *, per_process: int = INSTANCES_PER_PROCESS,
                   noun: str = "instance") -> tuple[int, str]:
    """``runtime.workers=auto``: the processes for ``todo`` units, and why, for the log."""
    if cfg.calls.dry_run:
        return 1, "a dry run calls no model"
    if cfg.calls.batch:
        return 1, "calls.batch waits on the provider, not on this process"
    embedded = cfg.embedded_model_names()
    if embedded:
        return 1, f"{', '.join(embedded)} run(s) inside the job's process"
    if not can_spawn():
        return 1, f"this process (start method {multiprocessing.get_start_method(allow_none=True)!r}) cannot spawn"
    cores = available_cores() if cores is None else cores
    slots = min(m.max_concurrency for m in cfg.model_configs())
    n = max(1, min(cores, todo // per_process, slots // SLOTS_PER_PROCESS))
    return n, (f"{todo} {noun}s left (a process per {per_process}), {slots} slots of the least concurrent "
               f"model (a process per {SLOTS_PER_PROCESS}), {cores} cores")


def processes(cfg: JobConfig, todo: int, *, per_process: int = INSTANCES_PER_PROCESS, noun: str = "instance") -> int:
    """``runtime.workers`` (or ``auto_processes``), capped by units left and model slots; 1 if unable to spawn."""
    if cfg.runtime.workers == AUTO_WORKERS:  # workers is Any: OmegaConf has no int | str field
        n, why = auto_processes(cfg, todo, per_process=per_process, noun=noun)
        log.log(logging.INFO if n > 1 else logging.DEBUG, "runtime.workers=auto: %d process%s (%s)", n,
                "es" if n > 1 else "", why)
        return n
    wanted: int = min(cfg.runtime.workers, todo, *(m.max_concurrency for m in cfg.model_configs()))
    if wanted <= 1:
        return 1
    if not can_spawn():
        log.warning("runtime.workers=%d: this process (start method %r) cannot start workers; the job runs its "
                    "calls alone", cfg.runtime.workers, multiprocessing.get_start_method(allow_none=True))
        return 1
    if wanted < cfg.runtime.workers:
        log.info("runtime.workers=%d: %d processes (one per %s left and per slot of the least concurrent "
                 "model at most)", cfg.runtime.workers, wanted, noun)
    return wanted

