"""Kill and resume: the real CLI, SIGKILLed at seeded random points and restarted with the same command.

The stub server counts every model response it completes. Before each kill it closes a gate: after
the k-th completed response it holds every further request unanswered, so the requests in flight at
the kill are known exactly, and the test waits until every completed response is in the client's
response cache (the client awaits litellm's cache write before it returns a completion). The final
results must equal an uninterrupted run's, and no completed model call may be repeated.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import diskcache
import pytest
from helpers.cli_runner import PROJECT_ROOT, cli_command, cli_env, job_dirs, read_jsonl, run_job, scoring

from cupid_exp.llm.response_cache import STORE_FOLDER
from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.stub_llm_server import StubServer

pytestmark = pytest.mark.slow

N_INSTANCES = 30
N_KILLS = 5


def cache_entries(cache_dir: Path) -> int:
    """Entries in the response cache's store (``calls.cache_dir``/responses)."""
    store = cache_dir / STORE_FOLDER
    if not store.exists():
        return 0
    with diskcache.Cache(str(store), disk=diskcache.JSONDisk) as cache:
        return len(cache)


def kill_after(stub: StubServer, cmd: list[str], completed: int, cache_dir: Path, log: Path,
               journal_dir: Path | None = None) -> dict[str, int]:
    """Start the CLI, SIGKILL it once ``completed`` responses are done in total; what was in flight then.
    ``journal_dir``: the responses let through finish a unit whatever their order; settle until the journal holds
    it too (under load its line came after the kill)."""
    stub.hold_after(completed)
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=cli_env(), stdout=out, stderr=subprocess.STDOUT)
        try:
            assert stub.wait_held(timeout=90), f"no request reached the gate; log:\n{log.read_text()[-2000:]}"
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:  # settle: nothing in flight but the held requests, all durable
                st = stub.stats()
                if st["in_flight"] == st["held"] and cache_entries(cache_dir) >= st["distinct_completed"] and (
                        journal_dir is None or journal_records(journal_dir) > 0):
                    break
                time.sleep(0.05)
            st, durable = stub.stats(), cache_entries(cache_dir)
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
            stub.release()
    return {"in_flight": st["in_flight"], "non_durable": st["distinct_completed"] - durable}


def tear_last_journal_line(journal_dir: Path) -> str:
    """Simulate a kill in the middle of a journal write: the last record is cut in half."""
    (path,) = journal_dir.glob("*.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    assert lines and lines[-1].endswith(b"\n")
    torn = lines[-1]
    path.write_bytes(b"".join(lines[:-1]) + torn[: len(torn) // 2])
    return json.loads(torn)["key"]


def journal_records(journal_dir: Path) -> int:
    paths = list(journal_dir.glob("*.jsonl"))
    return sum(1 for line in paths[0].read_bytes().splitlines() if line.endswith(b"}")) if paths else 0


def test_sigkill_at_random_points_then_resume_gives_identical_results(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N_INSTANCES)
    extra = ["tracking=none", "calls.num_retries=0"]
    with StubServer(latency_ms=5, seed=3) as stub:
        # the uninterrupted run
        base_root = tmp_path / "base"
        run_job(cli_command(stub.url, base_root, *extra, cache_dir=base_root / "cache", data=data))  # in this process
        baseline = stub.stats()
        assert baseline["total_completed"] == baseline["distinct_completed"] == 4 * N_INSTANCES
        (base_dir,) = job_dirs(base_root)
        expected = scoring(read_jsonl(base_dir / "instances.jsonl"))
        assert len(expected) == N_INSTANCES and all(r["f1"] is not None for r in expected)

        # the same job, killed at seeded random points; every attempt is the very same command
        stub.reset()
        root, cache = tmp_path / "killed", tmp_path / "cache"
        cmd = cli_command(stub.url, root, *extra, cache_dir=cache, data=data)
        points = sorted(random.Random(20240611).sample(range(3, baseline["total_completed"] - 3), N_KILLS))
        kills, torn_key, torn_log = [], None, None
        for i, point in enumerate(points):
            log = tmp_path / f"attempt{i}.log"
            finished_before = journal_records(root / "journal")
            kills.append(kill_after(stub, cmd, point, cache, log))
            text = log.read_text()
            assert ("resuming:" in text) == (finished_before > 0), text[-2000:]
            if torn_key is not None and torn_log is None:
                torn_log = text
            if torn_key is None and i < N_KILLS - 1 and journal_records(root / "journal") > 0:
                torn_key = tear_last_journal_line(root / "journal")
        assert torn_key is not None and torn_log is not None
        assert all(k["in_flight"] >= 1 for k in kills)  # each kill really cut requests off
        assert not job_dirs(root), "a killed attempt must not leave an instances.jsonl"
        final = run_job(cmd)  # the resume: no process of its own needed
        after = stub.stats()

    # identical per-instance results
    (final_dir,) = job_dirs(root)
    records = read_jsonl(final_dir / "instances.jsonl")
    assert scoring(records) == expected
    assert not list(final_dir.glob(".*.tmp")), "a temporary output file survived"

    # no completed call was repeated: every repeat must be a response that was not yet durable at a kill
    non_durable = sum(k["non_durable"] for k in kills)
    in_flight = sum(k["in_flight"] for k in kills)
    assert after["distinct_completed"] == baseline["total_completed"]  # the very same set of model calls
    assert after["repeated_completions"] <= non_durable
    assert after["total_completed"] <= baseline["total_completed"] + in_flight
    assert non_durable == 0, f"completed responses were not yet in the cache at a kill: {kills}"
    assert after["repeated_completions"] == 0

    # the journal: the torn record was dropped and its instance redone; every line is whole JSON now
    journal = read_jsonl(next((root / "journal").glob("*.jsonl")))
    assert torn_key in {r["key"] for r in journal}
    assert {r["key"] for r in journal} == {r["key"] for r in records}
    assert "dropping a torn last line" in torn_log
    assert "resuming:" in final.stdout + final.stderr


def test_a_killed_job_of_three_epochs_resumes_sending_each_instance_epoch_once(tmp_path: Path) -> None:
    """runtime.epochs=3: the journal and the resume work per (instance, epoch); a kill mid-run and the same command
    again send every (instance, epoch)'s calls once, no epoch answered by another's cache entry."""
    n, epochs = 4, 3
    data = write_dataset(tmp_path / "data.jsonl", n)
    root, cache = tmp_path / "killed", tmp_path / "cache"
    with StubServer(latency_ms=5, seed=3) as stub:
        cmd = cli_command(stub.url, root, "tracking=none", "calls.num_retries=0", f"runtime.epochs={epochs}",
                          cache_dir=cache, data=data)
        # 40 of 48 replies: more than the 36 (three of four calls for each of 12 units) that could leave all unfinished
        kill = kill_after(stub, cmd, 4 * n * epochs - 8, cache, tmp_path / "attempt.log", journal_dir=root / "journal")
        assert kill["in_flight"] >= 1 and kill["non_durable"] == 0  # the kill cut requests off
        journalled = journal_records(root / "journal")
        assert 0 < journalled < n * epochs and not job_dirs(root)
        final = run_job(cmd)  # the resume: no process of its own needed
        after = stub.stats()
    assert "resuming:" in final.stdout + final.stderr
    assert after["distinct_completed"] == after["total_completed"] == 4 * n * epochs  # each call went out once
    assert after["repeated_completions"] == 0
    (final_dir,) = job_dirs(root)
    records = read_jsonl(final_dir / "instances.jsonl")
    keys = [r["key"] for r in records]
    assert len(keys) == len(set(keys)) == n * epochs
    assert sorted((r["key"].split("#")[0], r["epoch"]) for r in records) == sorted(
        (k, e) for k in {r["key"].split("#")[0] for r in records} for e in range(epochs))
