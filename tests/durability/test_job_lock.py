"""One process per job: a second CLI process on a running job stops at once (one line naming the first, exit 2,
no request); once the first is SIGKILLed, the next takes the job over and completes it, no record twice."""

from __future__ import annotations

import json
import signal
import socket
import sys
from pathlib import Path

import pytest
from helpers.cli_runner import read_jsonl, run_cli
from helpers.tracking_runs import held_job, held_job_settled, job_command, only_run, store_uri, wait_for

from cupid_exp.durability import job_lock
from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.stub_llm_server import StubServer

N = 6
CALLS = 4 * N


def _journalled(root: Path) -> list[dict]:
    return [r for p in (root / "journal").glob("*.jsonl") for r in read_jsonl(p)]


@pytest.mark.slow
def test_a_second_process_on_a_running_job_stops_and_a_dead_ones_job_is_taken_over(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    root = tmp_path / "out"
    with StubServer(latency_ms=1) as stub:
        cmd = job_command(stub.url, root, data, "calls.num_retries=0")
        with held_job(stub, cmd, tmp_path / "first.log", after=CALLS - 8) as first:
            wait_for(lambda: _journalled(root), 60, "a journalled instance")
            received = held_job_settled(stub)
            second = run_cli(cmd, timeout=120, check=False)
            assert second.returncode == 2, (second.stdout[-2000:], second.stderr[-2000:])
            lines = second.stderr.strip().splitlines()
            assert lines[-1].startswith("cupid_exp: another process is running this job: ")
            assert f"pid {first.pid} on {socket.gethostname()} since 20" in lines[-1]
            assert "Traceback" not in second.stderr
            assert stub.stats()["total_received"] == received  # the second sent nothing
            only_run(store_uri(root))  # still one run
            assert len(_journalled(root)) < N
            first.send_signal(signal.SIGKILL)
            assert first.wait(timeout=30) == -signal.SIGKILL
        done_before = {r["key"] for r in _journalled(root)}
        third = run_cli(cmd, timeout=240)
    out = third.stdout + third.stderr
    assert f"taking over this job from pid {first.pid}" in out and f"resuming: {len(done_before)} of {N}" in out
    keys = [r["key"] for r in _journalled(root)]
    assert len(keys) == len(set(keys)) == N  # no instance journalled twice
    run = only_run(store_uri(root))  # the killed attempt's run, taken over and finished
    assert run.info.status == "FINISHED" and run.data.tags["cupid.attempt"] == "2"
    assert not list((root / "journal").glob("*.holder.json"))  # released at the end


def test_the_lock_names_its_holder_and_is_free_once_released(tmp_path: Path) -> None:
    import subprocess

    held = job_lock.acquire(tmp_path, "abc", "key1")
    assert job_lock.acquire(tmp_path, "abc", "key1") is held  # this process planning the same job again
    holder = json.loads(held.holder_file(held.path).read_text())
    assert holder["host"] == socket.gethostname() and holder["pid"] > 0
    probe = ("import sys; from pathlib import Path; from cupid_exp.durability import job_lock\n"
             "try:\n    job_lock.acquire(Path(sys.argv[1]), 'abc', sys.argv[2])\nexcept job_lock.JobRunning as exc:\n"
             "    print(exc); sys.exit(2)\nprint('acquired')\n")
    # the same job in another process: stopped at once
    taken = subprocess.run([sys.executable, "-c", probe, str(tmp_path), "key1"], capture_output=True, text=True,
                           timeout=60)
    assert taken.returncode == 2 and f"pid {holder['pid']} on {holder['host']}" in taken.stdout
    # the same calls reported differently (another run key): it waits for the journal, then has it
    waiting = subprocess.Popen([sys.executable, "-c", probe, str(tmp_path), "key2"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(timeout=8)
        held.release()
        out, _ = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 0 and "acquired" in out and "waiting for pid" in out, out


def test_a_lock_and_holder_note_of_garbage_stop_nothing(tmp_path: Path) -> None:
    """The lock is the operating system's, not the file's bytes, and the holder note only names a process: garbage
    in either (a torn copy) is taken as no holder, and the note is written anew."""
    path = job_lock.lock_path(tmp_path, "abc")
    garbage = b"\x00\x17not json\xff" * 30
    path.write_bytes(garbage)
    job_lock.JobLock.holder_file(path).write_bytes(garbage)
    with pytest.raises(ValueError):  # the fault: the note cannot be read
        json.loads(job_lock.JobLock.holder_file(path).read_bytes())
    held = job_lock.acquire(tmp_path, "abc", "key1")
    try:
        assert json.loads(held.holder_file(path).read_text())["run_key"] == "key1"
    finally:
        held.release()
