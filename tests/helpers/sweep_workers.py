"""A joblib sweep's loky workers kept from one in-process command (``cli_runner.run_job``) to the next, where a new
process each time would start two more (each importing Hydra, litellm and the package: most of a sweep cell's CPU).

A kept worker is no fresh process, so it starts each command as ``run_job`` starts this one: its pools forgotten
(no answer, refusal or pace learned by an earlier command) and no MLflow run worker parked by an earlier command's
job (``Fresh``, the sweep's job function in the worker). Workers are let go (killed, as the process's exit does)
when the environment, folder or import path they were started with would differ, before loky's own idle timeout
stops them (an idle worker's exit can hang: ``cupid_exp.entry._release_sweep_workers``), and at the session's end.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

#: a kept worker idle this long is let go before the next command (loky stops an idle one after 300 s by itself)
KEEP_S = 120.0
#: what pytest changes between tests, which no job reads, and what libraries set for their process when first
#: imported (litellm's tokenizer folder, OpenMP's fork setting), which each worker sets for itself as it imports them
_IGNORED = ("PYTEST_CURRENT_TEST", "TIKTOKEN_CACHE_DIR", "KMP_INIT_AT_FORK")

_started_with: tuple[Any, ...] | None = None  #: what the kept workers were started with (``_started``)
_ended_at = 0.0  #: when the last command ended (``time.monotonic``)
_command = 0  #: this process's in-process commands so far
_served = 0  #: in a worker: the command whose job it ran last
_real: Any = None  #: the launcher's own job function, while ``Fresh`` stands in for it


def _started() -> tuple[Any, ...]:
    """What a new worker takes from this process: its environment, folder and import path."""
    env = {k: v for k, v in os.environ.items() if k not in _IGNORED}
    return env, os.getcwd(), tuple(sys.path)


def release() -> None:
    """Stop the workers by force (``cupid_exp.entry._release_sweep_workers``); the next sweep starts its own."""
    global _started_with
    _started_with = None
    if _executor() is not None:
        from cupid_exp.entry import _release_sweep_workers

        _release_sweep_workers()


def _executor() -> Any:
    reusable = sys.modules.get("joblib.externals.loky.reusable_executor")
    return getattr(reusable, "_executor", None)


def before(keep: bool) -> None:
    """Before a command (its environment set): let kept workers go unless ``keep`` and they would be started the same
    way now; a kept command's launcher runs each job through ``Fresh``."""
    global _started_with, _command, _real
    now = _started()
    if _executor() is not None and not (keep and now == _started_with and time.monotonic() - _ended_at < KEEP_S):
        release()
    if not keep:
        return
    from hydra_plugins.hydra_joblib_launcher import _core

    _started_with, _command, _real = now, _command + 1, _core.execute_job
    _core.execute_job = Fresh(_command)


def after(keep: bool) -> None:
    """After a command: its workers kept (``keep``: the launcher's job function put back) or stopped, as the
    process's exit stops them."""
    global _ended_at
    if not keep:
        release()
        return
    from hydra_plugins.hydra_joblib_launcher import _core

    if isinstance(_core.execute_job, Fresh):
        _core.execute_job = _real
    _ended_at = time.monotonic()


class Fresh:
    """The sweep's job function in a worker: the first job of a command there forgets what earlier ones learned."""

    def __init__(self, command: int):
        self.command = command

    def __call__(self, *args: Any) -> Any:
        global _served
        from hydra_plugins.hydra_joblib_launcher import _core

        execute_job = _real if isinstance(_core.execute_job, Fresh) else _core.execute_job  # n_jobs=1: this process
        if _served != self.command:
            from cupid_exp.llm.pools import forget_pools
            from cupid_exp.tracking import run_worker

            forget_pools()
            run_worker.quit_idle()
            _served = self.command
        return execute_job(*args)
