"""runtime.workers=auto (the default): more than one process only for a large API job, up to the cores it may use
(``cupid_exp.job.worker_count``); an explicit number is taken as before; neither changes the job's identity."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from helpers.jobs import stub_config, stub_plan

from cupid_exp.config import ConfigError
from cupid_exp.job import worker_count
from cupid_exp.job.plan import typed_config
from cupid_exp.job.worker_count import INSTANCES_PER_PROCESS, SLOTS_PER_PROCESS, auto_processes, processes

URL = "http://127.0.0.1:9/v1"
ROLES = ("model", "evaluator.decomposer", "evaluator.matcher", "evaluator.judge")


def _cfg(tmp_path: Path, *overrides: str, concurrency: int = 64):
    return typed_config(stub_config(URL, tmp_path, *(f"{r}.max_concurrency={concurrency}" for r in ROLES),
                                    *overrides))


def test_auto_is_the_default_and_grows_with_the_job_up_to_the_cores(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    assert cfg.runtime.workers == "auto"
    assert auto_processes(cfg, todo=30, cores=2)[0] == 1  # a small job never earns a second start back
    assert auto_processes(cfg, todo=2 * INSTANCES_PER_PROCESS - 1, cores=2)[0] == 1
    assert auto_processes(cfg, todo=2 * INSTANCES_PER_PROCESS, cores=2)[0] == 2
    assert auto_processes(cfg, todo=756, cores=2)[0] == 2  # the benchmark's size on two cores: both
    assert auto_processes(cfg, todo=756, cores=1)[0] == 1
    assert auto_processes(cfg, todo=3 * INSTANCES_PER_PROCESS, cores=64)[0] == 3  # the size bounds it
    assert auto_processes(cfg, todo=100_000, cores=64)[0] == 64 // SLOTS_PER_PROCESS  # so do the slots


def test_auto_stays_at_one_process_where_another_cannot_help(tmp_path: Path) -> None:
    low = _cfg(tmp_path, concurrency=2 * SLOTS_PER_PROCESS - 1)  # the least concurrent model decides
    assert auto_processes(low, todo=10_000, cores=16)[0] == 1
    one_slow_role = _cfg(tmp_path, "evaluator.judge.max_concurrency=8")
    assert auto_processes(one_slow_role, todo=10_000, cores=16)[0] == 1
    for overrides, why in ((("calls.batch=true",), "calls.batch"), (("calls.dry_run=true",), "dry run"),
                           (("model=local",), "inside the job's process")):
        n, said = auto_processes(_cfg(tmp_path, *overrides), todo=10_000, cores=16)
        assert n == 1 and why in said


def test_auto_stays_at_one_process_where_none_can_be_spawned(tmp_path: Path, monkeypatch) -> None:
    """joblib's loky workers have their own start method: a spawned child of theirs dies at once."""
    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "loky")
    n, why = auto_processes(_cfg(tmp_path), todo=10_000, cores=16)
    assert n == 1 and "cannot spawn" in why


def test_the_cores_are_those_this_process_may_use(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(worker_count.os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert worker_count.available_cores() == 1
    assert processes(_cfg(tmp_path), todo=10_000) == 1
    monkeypatch.setattr(worker_count.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert processes(_cfg(tmp_path), todo=10_000) == 4


def test_an_explicit_number_is_kept_and_bad_values_are_refused(tmp_path: Path) -> None:
    assert processes(_cfg(tmp_path, "runtime.workers=3"), todo=30) == 3  # even where auto would choose 1
    assert processes(_cfg(tmp_path, "runtime.workers=1"), todo=10_000) == 1
    for bad in ("0", "-1", "many", "true"):
        with pytest.raises(ConfigError, match=r"runtime.workers=.* is not allowed: 'auto' or an integer >= 1"):
            _cfg(tmp_path, f"runtime.workers={bad}")
    assert _cfg(tmp_path, "calls.batch=true").runtime.workers == "auto"  # auto goes with the Batch API
    with pytest.raises(ConfigError, match=r"runtime.workers=2 is not allowed: 1 with calls.batch=true"):
        _cfg(tmp_path, "calls.batch=true", "runtime.workers=2")


def test_the_job_identity_does_not_depend_on_the_number_of_processes(tmp_path: Path) -> None:
    identities = {stub_plan(URL, tmp_path / value, f"runtime.workers={value}").identity
                  for value in ("auto", "1", "2")}
    assert len(identities) == 1
