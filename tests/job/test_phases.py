"""The job's four phases, each called in-process against the stub model server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.jobs import stub_config, stub_plan

from cupid_exp.config import ConfigError
from cupid_exp.data.loading import SAMPLE_FULL_PATH
from cupid_exp.evaluation import plan
from cupid_exp.job import connect, execute, job_outcome, publish, summarize_job
from cupid_exp.testing.stub_llm_server import StubServer

PARTS = ("inference", "generation")
NINE = ("data=local", f"data.path={SAMPLE_FULL_PATH}")  # the 9-row sample: three personas x three types


def test_plan_checks_everything_before_any_call(tmp_path: Path) -> None:
    with StubServer() as stub:
        job = stub_plan(stub.url, tmp_path, *NINE, "task=both", "setting=oracle")
        assert stub.stats()["total_received"] == 0
    assert job.work.kind.parts == PARTS and job.work.kind.setting.name == "oracle"
    assert len(job.todo) == 9 and job.ctx is not None and job.identity
    with pytest.raises(ConfigError, match="setting=oracle_preference is defined for generation only"):
        plan(stub_config("http://127.0.0.1:9/v1", tmp_path, "task=both", "setting=oracle_preference"), tmp_path)
    with pytest.raises(ConfigError, match=r"calls.timeout=0.0 is not allowed: a number > 0"):
        plan(stub_config("http://127.0.0.1:9/v1", tmp_path, "calls.timeout=0"), tmp_path)


def test_execute_summarize_publish(tmp_path: Path, capsys) -> None:
    with StubServer() as stub:
        job = stub_plan(stub.url, tmp_path, *NINE, "task=both")
        execution = execute(job)
    assert len(execution.results) == 9 and execution.seconds > 0
    result = execution.results[0]
    assert result.inference.f1 is not None and result.generation.judge_score == 7.5
    summary = summarize_job(job, execution, started=0.0)
    assert summary.complete and summary.metrics["instances/failed"] == 0
    assert summary.metrics["calls/total"] == 9 * 6  # infer, decompose, 2 matches, generate, judge
    assert job_outcome(job, summary).value == summary.metrics["inference/f1"]  # the sweepers' headline
    assert [r["key"] for r in summary.records] == [i.key for i in job.work.units]  # dataset order
    publish(job, summary, tracker=None)
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == "complete: 9 of 9 instances ran without a failed step"
    lines = (job.output_dir / "instances.jsonl").read_text().splitlines()
    assert [json.loads(line)["key"] for line in lines] == [r["key"] for r in summary.records]
    saved = json.loads((job.output_dir / "metrics.json").read_text())
    assert saved["complete"] is True and saved["failed_instances"] == 0


def test_a_rerun_replays_the_journal_and_calls_nothing(tmp_path: Path) -> None:
    with StubServer() as stub:
        first = stub_plan(stub.url, tmp_path, *NINE)
        execute(first)
        received = stub.stats()["total_received"]
        again = stub_plan(stub.url, tmp_path, *NINE)
        assert again.todo == [] and again.ctx is None and len(again.attempt.done) == 9
        assert execute(again).results == []
        summary = summarize_job(again, execute(again), started=0.0)
        assert stub.stats()["total_received"] == received
    assert summary.metrics["resume/instances_from_journal"] == 9 and summary.complete


def test_another_failure_policy_replays_the_same_journal(tmp_path: Path) -> None:
    with StubServer(garbage_steps=("decompose",), garbage_rate=0.5, seed=3) as stub:
        excluded = stub_plan(stub.url, tmp_path, *NINE, "runtime.reask=0")
        run = execute(excluded)
        received = stub.stats()["total_received"]
        zero = stub_plan(stub.url, tmp_path, *NINE, "runtime.reask=0", "runtime.failure_policy=zero")
        assert zero.identity == excluded.identity and zero.todo == []
        z = summarize_job(zero, execute(zero), started=0.0)
        e = summarize_job(excluded, run, started=0.0)
        assert stub.stats()["total_received"] == received
    assert 0 < e.failed_instances == z.failed_instances < 9
    assert z.metrics["inference/n"] == 9 and e.metrics["inference/n"] == 9 - e.failed_instances
    assert z.metrics["inference/precision"] < e.metrics["inference/precision"]


def test_the_job_starts_without_pandas_numpy_or_matplotlib() -> None:
    """Start-up pays for Hydra and the job's own modules only: pandas and numpy load while the first models
    answer (``import_alongside``), matplotlib in the MLflow worker."""
    import subprocess
    import sys

    script = ("import sys, cupid_exp.cli, cupid_exp.job, cupid_exp.evaluation, cupid_exp.synthesize, "
              "cupid_exp.scoring, cupid_exp.settings, cupid_exp.tasks, cupid_exp.synthesis.work\n"
              "print([m for m in ('pandas', 'numpy', 'matplotlib', 'litellm', 'mlflow') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_import_alongside_loads_its_modules_and_leaves_failures_to_the_caller(monkeypatch) -> None:
    import sys
    import threading

    from cupid_exp.job import import_alongside

    unhandled: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: unhandled.append(args.exc_value))
    monkeypatch.delitem(sys.modules, "cupid_exp.reporting.build", raising=False)
    thread = import_alongside(("cupid_exp.reporting.build", "cupid_exp.no_such_module"))
    thread.join(60)
    assert not thread.is_alive() and "cupid_exp.reporting.build" in sys.modules and unhandled == []
    with pytest.raises(ModuleNotFoundError):  # where the module is used, the import raises as usual
        __import__("cupid_exp.no_such_module")


def test_instances_beyond_twice_the_model_slots_wait_unstarted(tmp_path: Path, monkeypatch) -> None:
    """With one slot per model config, at most two instances per slot run at once; the others wait unstarted
    (they hold no prompt). All nine still run, in full."""
    from cupid_exp.evaluation import instances as phase
    from cupid_exp.evaluation import work

    running, peak = 0, 0
    real = work.evaluate_instance

    async def counted(*args, **kwargs):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            return await real(*args, **kwargs)
        finally:
            running -= 1

    monkeypatch.setattr(work, "evaluate_instance", counted)
    one_slot = [f"{r}.max_concurrency=1" for r in ("model", "evaluator.decomposer", "evaluator.matcher",
                                                    "evaluator.judge")]
    with StubServer(latency_ms=20) as stub:
        job = stub_plan(stub.url, tmp_path, *NINE, *one_slot)
        connect(job)
        limit = phase.instances_in_flight(job.ctx)
        execution = execute(job)
    assert limit < 9 and peak == limit
    assert len(execution.results) == 9 and all(r.inference.f1 is not None for r in execution.results)


def test_roles_on_one_provider_pool_share_its_bound_in_the_instances_started(tmp_path: Path) -> None:
    """Instances in flight follow the pools, not the model configs: four roles on one pool of 3 start 2 x 3; the
    judge moved to a pool of its own (its bound 5) adds 2 x 5."""
    from cupid_exp.evaluation import instances as phase

    roles = ("model", "evaluator.decomposer", "evaluator.matcher", "evaluator.judge")
    with StubServer() as stub:
        # four distinct configs (each its own temperature: four clients), one endpoint: one pool
        distinct = [f"++{r}.params.temperature={i / 10}" for i, r in enumerate(roles)]
        shared = stub_plan(stub.url, tmp_path / "a", *NINE, *[f"{r}.max_concurrency=3" for r in roles], *distinct)
        connect(shared)
        clients = (shared.ctx.subject, shared.ctx.evaluator.decomposer, shared.ctx.evaluator.matcher,
                   shared.ctx.evaluator.judge)
        assert len({id(c) for c in clients}) == 4 and len({id(c.pool) for c in clients}) == 1
        assert phase.instances_in_flight(shared.ctx) == 2 * 3
        apart = stub_plan(stub.url, tmp_path / "b", *NINE, *[f"{r}.max_concurrency=3" for r in roles[:3]],
                          "evaluator.judge.max_concurrency=5", "evaluator.judge.pool.name=judge_pool", *distinct)
        connect(apart)
        assert phase.instances_in_flight(apart.ctx) == 2 * 3 + 2 * 5
