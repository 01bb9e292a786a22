"""runtime.workers: a job's model calls shared by worker processes (``cupid_exp.job.workers``), against the stub."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.jobs import stub_config, stub_plan
from helpers.processes import alive, children
from helpers.worker_bug import InWorkers, InWorkersConfig, unregister

from cupid_exp.config import ConfigError
from cupid_exp.durability.ledger import UsageLedger
from cupid_exp.evaluation import plan
from cupid_exp.job import Job, execute, summarize_job
from cupid_exp.job.plan import connect, typed_config
from cupid_exp.job.worker_count import processes
from cupid_exp.job.workers import WorkerFailed, Workers, start_workers
from cupid_exp.llm._litellm import native_runtime_started
from cupid_exp.llm.client import clients_for
from cupid_exp.llm.usage import UsageMeter, requests_sent
from cupid_exp.outputs import EnvironmentFailure, environment_failure
from cupid_exp.testing.stub_llm_server import StubServer

unregister()  # only the workers that unpickle its config need it registered

ROLES = ("model", "evaluator.decomposer", "evaluator.matcher", "evaluator.judge")


def _nine() -> tuple[str, ...]:
    from cupid_exp.data.loading import SAMPLE_FULL_PATH

    return ("data=local", f"data.path={SAMPLE_FULL_PATH}", "task=both")


def _concurrency(n: int) -> list[str]:
    return [f"{role}.max_concurrency={n}" for role in ROLES]


def _ready(workers: Workers, timeout: float = 120.0) -> None:
    """Wait until every worker has built its clients (they then wait for the job's go)."""
    deadline = time.monotonic() + timeout
    while workers.shared.ready.value < len(workers.processes):
        assert time.monotonic() < deadline, "a worker did not get ready"
        assert all(p.exitcode is None for p in workers.processes), "a worker exited before it was ready"
        time.sleep(0.05)


def _with_setting(job: Job, setting: object) -> None:
    """The job's work with another setting (the kind is frozen: a new description in a new spec)."""
    kind = dataclasses.replace(job.work.kind, setting=setting)
    job.spec = dataclasses.replace(job.spec, work=dataclasses.replace(job.work, kind=kind))


def _scores(results) -> dict[str, tuple]:
    return {r.key: (r.inference.precision, r.inference.recall, r.generation.judge_score) for r in results}


def test_each_models_concurrency_is_split_and_the_processes_are_bounded(tmp_path: Path) -> None:
    cfg = typed_config(stub_config("http://127.0.0.1:9/v1", tmp_path, "runtime.workers=3",
                                   "model.max_concurrency=8", "evaluator.judge.max_concurrency=4"))

    def slots(cfg, index: int, n: int) -> dict[str, int]:
        clients = clients_for(cfg.roles(), cfg.calls, UsageMeter(), share=(index, n))
        return {role: client.slots for role, client in clients.items()}

    shares = [slots(cfg, i, 3) for i in range(3)]
    assert [s["model"] for s in shares] == [3, 3, 2]  # together: the configured 8
    assert [s["evaluator.judge"] for s in shares] == [2, 1, 1]
    assert cfg.model.max_concurrency == 8 and slots(cfg, 0, 1)["model"] == 8  # the job's config is left alone
    shared_object = typed_config(stub_config("http://127.0.0.1:9/v1", tmp_path, "model.max_concurrency=8"))
    shared_object.evaluator.judge = shared_object.model  # two roles, one config object: split once
    assert slots(shared_object, 0, 2)["evaluator.judge"] == 4
    assert processes(cfg, todo=100) == 3
    assert processes(cfg, todo=2) == 2  # one per instance left at most
    few = typed_config(stub_config("http://127.0.0.1:9/v1", tmp_path, "runtime.workers=8",
                                   "evaluator.matcher.max_concurrency=2"))
    assert processes(few, todo=100) == 2  # each process needs a slot of every model


def test_embedded_models_refuse_workers_before_any_call(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"runtime.workers=2: .* inside the job's process"):
        plan(stub_config("http://127.0.0.1:9/v1", tmp_path, "model=local", "runtime.workers=2"), tmp_path / "job")
    with pytest.raises(ConfigError, match=r"runtime.workers=0 is not allowed"):
        plan(stub_config("http://127.0.0.1:9/v1", tmp_path, "runtime.workers=0"), tmp_path / "job")


@pytest.mark.parametrize("start", ["before the clients (run_job)", "after the clients"])
def test_two_processes_run_every_instance_once_within_the_configured_bound(tmp_path: Path, caplog, monkeypatch,
                                                                          start: str) -> None:
    """One slot per model in each process: two requests at once means both processes called the stub, three
    would break the configured bound. The results, usage and journal are those of a one-process run, and the
    worker's log lines reach the job's log. Started before the job's clients (as ``run_job`` does), the worker is
    forked on Linux and builds its own clients; started after them, it is spawned. A forked worker is slow to
    leave after its last word (as on a loaded machine): stopping the workers waits for it, never kills it."""
    real_exit = os._exit

    def slow_exit(code: int) -> None:
        time.sleep(2)
        real_exit(code)

    monkeypatch.setattr(os, "_exit", slow_exit)  # a forked worker inherits it; this process never exits by it
    with StubServer(latency_ms=150) as stub:
        config = stub_config(stub.url, tmp_path / "two", *_nine(), *_concurrency(2), "runtime.workers=2")
        before = start.startswith("before")
        job = plan(config, tmp_path / "two" / "job", clients=not before)
        assert job.attempt.processes == 2
        _with_setting(job, InWorkers(InWorkersConfig()))  # the standard setting, which logs when a worker runs it
        # forked where nothing in this test process has called a model yet (litellm's runtime would not survive)
        forked = before and sys.platform.startswith("linux") and not native_runtime_started()
        workers = start_workers(job)
        assert [p._popen.method for p in workers.processes] == ["fork" if forked else "spawn"]
        if before:
            connect(job)
        try:
            _ready(workers)
            execution = execute(job, workers=workers)
        finally:
            workers.stop()
        stats = stub.stats()
        stub.config.wire.latency_ms = 0
        alone = stub_plan(stub.url, tmp_path / "one", *_nine(), *_concurrency(2))
        assert alone.attempt.processes == 1 and alone.identity == job.identity  # workers change no result
        alone_results = execute(alone).results
    assert stats["peak_in_flight"] == 2 and stats["total_received"] == 9 * 6
    assert all(p.exitcode == 0 for p in workers.processes)  # each sent its last word and left
    assert sorted(r.key for r in execution.results) == sorted(i.key for i in job.work.units)
    summary = summarize_job(job, execution, started=0.0)
    assert summary.metrics["calls/total"] == 9 * 6 and summary.metrics["calls/requests"] == 9 * 6  # merged usage
    ledger = UsageLedger(job.attempt.ledger.path).load().totals()  # each process wrote its own counts, each once
    assert ledger["calls"] == 9 * 6 and requests_sent(ledger) == 9 * 6
    assert execution.cpu_seconds > 0
    journal = job.attempt.journal.path.read_text().splitlines()
    assert sorted(json.loads(line)["key"] for line in journal) == sorted(i.key for i in job.work.units)
    assert _scores(alone_results) == _scores(execution.results)
    in_worker = [r for r in caplog.records if r.getMessage().endswith("ran in a worker")]
    assert in_worker and {r.processName for r in in_worker} == {"cupid-calls-1"}


def test_a_bug_in_a_worker_stops_the_job_with_its_traceback(tmp_path: Path) -> None:
    with StubServer(latency_ms=100) as stub:
        job = stub_plan(stub.url, tmp_path, *_nine(), *_concurrency(2), "runtime.workers=2")
        _with_setting(job, InWorkers(InWorkersConfig(bug=True)))  # raises in workers (standard in the job's own)
        workers = start_workers(job)
        try:
            _ready(workers)
            with pytest.raises(WorkerFailed, match=r"(?s)stopped on a bug:.*TypeError: a bug only workers have"):
                execute(job, workers=workers)
        finally:
            workers.stop()
    assert all(p.exitcode is not None for p in workers.processes)


def test_a_full_disk_in_a_worker_is_the_environments_failure_not_a_bug(tmp_path: Path) -> None:
    """The job ends as it would in one process: the one line naming the file (exit 5), no worker's traceback."""
    with StubServer(latency_ms=100) as stub:
        job = stub_plan(stub.url, tmp_path, *_nine(), *_concurrency(2), "runtime.workers=2")
        _with_setting(job, InWorkers(InWorkersConfig(disk_full=True)))  # ENOSPC in the worker only
        workers = start_workers(job)
        try:
            _ready(workers)
            with pytest.raises(EnvironmentFailure) as raised:
                execute(job, workers=workers)
        finally:
            workers.stop()
    line = str(raised.value)
    assert line.startswith("environment failure: /full/usage/ledger.jsonl: No space left on device [ENOSPC]"), line
    assert "\n" not in line and environment_failure(raised.value) is raised.value
    assert all(p.exitcode is not None for p in workers.processes)


@pytest.mark.parametrize("when", ["while it calls", "before it is ready"])
def test_a_worker_that_dies_stops_the_job(tmp_path: Path, when: str) -> None:
    """Killed mid-job, or before it read the instances (the job must neither hang nor lose them silently)."""
    with StubServer(latency_ms=300) as stub:
        job = stub_plan(stub.url, tmp_path, *_nine(), *_concurrency(2), "runtime.workers=2")
        workers = start_workers(job)
        worker = workers.processes[0]

        def kill_once_both_call() -> None:
            deadline = time.monotonic() + 60
            while stub.stats()["in_flight"] < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(worker.pid, signal.SIGKILL)

        try:
            if when == "before it is ready":
                os.kill(worker.pid, signal.SIGKILL)
            else:
                _ready(workers)
                threading.Thread(target=kill_once_both_call, daemon=True).start()
            with pytest.raises(WorkerFailed, match=r"worker process cupid-calls-1 died \(exit code -9\)"):
                execute(job, workers=workers)
        finally:
            workers.stop()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_a_job_killed_outright_leaves_no_worker_calling_models(tmp_path: Path) -> None:
    """SIGKILL gives the job no chance to stop its workers: each notices its parent is gone and exits, instead of
    making calls for nobody (and then hanging on a queue no one reads)."""
    from helpers.cli_runner import cli_command, cli_env

    from cupid_exp.testing.cupid_data import write_dataset

    data = write_dataset(tmp_path / "data.jsonl", 12)
    with StubServer(latency_ms=400) as stub:
        cmd = cli_command(stub.url, tmp_path / "out", "tracking=none", "runtime.workers=2", "calls.cache=false",
                          *_concurrency(2), data=data)
        job = subprocess.Popen(cmd, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while stub.stats()["in_flight"] < 2:  # both processes are calling
                assert job.poll() is None and time.monotonic() < deadline, "the job did not reach its calls"
                time.sleep(0.05)
            workers = children(job.pid)
            assert workers
            job.kill()
            job.wait(10)
            deadline = time.monotonic() + 15
            while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
                time.sleep(0.1)
            left = [pid for pid in workers if alive(pid)]
            received = stub.stats()["total_received"]
            time.sleep(1.0)
            assert left == [] and stub.stats()["total_received"] == received
        finally:
            if job.poll() is None:
                job.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
def test_a_sweeps_later_job_forks_its_worker_too_and_every_call_of_both_jobs_is_made(tmp_path: Path) -> None:
    """Jobs of a ``-m`` sweep run one after the other in one process. The client's calls (``litellm.acompletion``)
    do not start litellm's native runtime, so the later job forks its worker as the first did (through litellm's
    Router they did, and every later job paid for a spawned worker's start), and that worker calls models."""
    from helpers.cli_runner import cli_command, cli_env, run_cli

    from cupid_exp.testing.cupid_data import write_dataset

    data = write_dataset(tmp_path / "data.jsonl", 4)
    with StubServer(latency_ms=50) as stub:
        cmd = cli_command(stub.url, tmp_path / "out", "tracking=none", "runtime.workers=2", "calls.cache=false",
                          *_concurrency(2), data=data)
        done = run_cli([*cmd[:3], "-m", *cmd[3:], "model.params.temperature=0,0.5"], env=cli_env(), timeout=300)
        received = stub.stats()["total_received"]
    log = done.stdout + done.stderr
    methods = [line.rsplit("; ", 1)[1].rstrip(")") for line in log.splitlines()
               if "model calls shared by 2 processes (runtime.workers; " in line]
    assert methods == ["forked", "forked"]
    assert received == 2 * 4 * 4  # every instance of both jobs: infer, decompose, match x2
    statuses = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").rglob("job_status.json"))]
    assert [s["outcome"] for s in statuses] == ["ok", "ok"], statuses


_NATIVE_THEN_WORKERS = """
import asyncio, json, sys
from pathlib import Path
import litellm
from helpers.jobs import stub_config
from cupid_exp.evaluation import plan
from cupid_exp.job import execute
from cupid_exp.job.plan import connect
from cupid_exp.job.workers import start_workers
from cupid_exp.llm._litellm import native_runtime_started
from cupid_exp.llm.client import clients_for

url, folder, overrides = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
before = native_runtime_started()
router = litellm.Router(model_list=[{"model_name": "r", "litellm_params": {
    "model": "openai/stub", "api_base": url, "api_key": "k"}}])
asyncio.run(router.acompletion(model="r", messages=[{"role": "user", "content": "hi"}]))  # a native route
job = plan(stub_config(url, folder, *overrides), folder / "job", clients=False)
workers = start_workers(job)
connect(job)
try:
    results = execute(job, workers=workers).results
finally:
    workers.stop()
print(json.dumps({"before": before, "after": native_runtime_started(), "results": len(results),
                  "methods": [p._popen.method for p in workers.processes],
                  "exits": [p.exitcode for p in workers.processes]}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
def test_once_litellms_native_runtime_has_started_the_workers_are_spawned_and_call_models(tmp_path: Path) -> None:
    """litellm's native (Rust) runtime does not survive a fork: a worker forked after a native route ran could not
    call a model (``ForkedAfterNativeRuntimeStarted``). A Router call starts that runtime here, in a fresh process;
    the job's worker is then spawned, and it makes its calls."""
    from helpers.cli_runner import cli_env

    tests = Path(__file__).resolve().parents[1]
    with StubServer(latency_ms=50) as stub:
        env = {**cli_env(), "PYTHONPATH": os.pathsep.join([str(tests), cli_env().get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, "-c", _NATIVE_THEN_WORKERS, stub.url, str(tmp_path), *_nine(),
                               *_concurrency(2), "runtime.workers=2"], env=env, capture_output=True, text=True,
                              timeout=300)
        received = stub.stats()["total_received"]
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["before"] is False and out["after"] is True
    assert out["methods"] == ["spawn"] and out["exits"] == [0]
    assert out["results"] == 9 and received == 1 + 9 * 6  # the Router's one call, then every call of the job


def test_a_process_runs_at_most_its_fair_share_of_the_units_at_once() -> None:
    """40 personas on 2 processes of 32 slots each: the first process took 32 at once and the other 8, and from
    then on 32 calls were in flight of 64."""
    import asyncio

    from cupid_exp.job.lanes import fair_share, run_units

    assert fair_share(40, 2) == 20 and fair_share(41, 2) == 21 and fair_share(1, 4) == 1
    assert fair_share(40, 1) is None  # one process: its lanes as its work says

    class Kind:
        running = peak = 0

        async def run(self, ctx, unit, progress):
            Kind.running += 1
            Kind.peak = max(Kind.peak, Kind.running)
            await asyncio.sleep(0.01)
            Kind.running -= 1
            return unit

    units = iter(range(40))
    done: list[int] = []
    asyncio.run(run_units(Kind(), None, 32, lambda: next(units, None), lambda unit, result, calls: done.append(unit),
                          None, False, fair_share(40, 2)))
    assert sorted(done) == list(range(40)) and Kind.peak == 20
