"""The collector kept off the job's start-up, and off its long-lived objects while units run (``job.heap``)."""

from __future__ import annotations

import gc
import importlib
from pathlib import Path

import pytest
from helpers.jobs import stub_plan

from cupid_exp.data.loading import SAMPLE_FULL_PATH
from cupid_exp.job import execute
from cupid_exp.job.heap import long_lived_frozen, start_up
from cupid_exp.testing.stub_llm_server import StubServer

execute_module = importlib.import_module("cupid_exp.job.workers")  # the module, not the function


@pytest.fixture(autouse=True)
def _collector_restored():
    yield
    gc.unfreeze()
    gc.enable()


def test_start_up_pauses_collections_and_the_units_run_with_them_on_over_a_frozen_heap() -> None:
    kept = [object() for _ in range(10)]  # noqa: F841  # something alive to freeze
    with start_up():
        assert not gc.isenabled()
        with long_lived_frozen():
            assert gc.isenabled() and gc.get_freeze_count() > 0
        assert gc.get_freeze_count() == 0  # a sweep's next job can collect what this one left
    assert gc.isenabled()


def test_a_job_started_with_collections_off_keeps_them_off() -> None:
    gc.disable()
    with start_up():
        pass
    assert not gc.isenabled()


def test_execute_runs_the_units_over_a_frozen_heap_and_gives_it_back(tmp_path: Path, monkeypatch) -> None:
    seen: list[tuple[bool, int]] = []
    run_all = execute_module._run_all

    def observed(*args, **kwargs):
        seen.append((gc.isenabled(), gc.get_freeze_count()))
        return run_all(*args, **kwargs)

    monkeypatch.setattr(execute_module, "_run_all", observed)
    with StubServer() as stub:
        job = stub_plan(stub.url, tmp_path, "data=local", f"data.path={SAMPLE_FULL_PATH}", "runtime.workers=1")
        with start_up():
            execution = execute(job)
    assert len(execution.results) == 9
    assert len(seen) == 1 and seen[0][0] and seen[0][1] > 0
    assert gc.get_freeze_count() == 0 and gc.isenabled()
