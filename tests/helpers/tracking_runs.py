"""Shared by the tracking tests: a priced stub job through the real CLI, and reading its MLflow run back."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from mlflow.tracking import MlflowClient

from cupid_exp.testing.inprocess import InProcessModel
from helpers.cli_runner import PROJECT_ROOT, cli_command, cli_env

# Priced like gpt-4o, so cost is counted (litellm does not know the stub).
PRICES = [f"{role}.model_info.{kind}_cost_per_token={price}"
          for role in ("model", "evaluator.decomposer", "evaluator.matcher", "evaluator.judge")
          for kind, price in (("input", "2.5e-06"), ("output", "1e-05"))]


def job_command(url: str | InProcessModel, root: Path, data: Path, *extra: str, cache_dir: Path | None = None,
                seed: bool = True) -> list[str]:
    """The CLI on the stub, priced, with a quick progress interval and its own cache (unless given one)."""
    return cli_command(url, root, *PRICES, "tracking.progress_every_s=0.5", *extra,
                       cache_dir=cache_dir or root / "cache", data=data, seed=seed)


def store_uri(root: Path) -> str:
    return f"sqlite:///{root / 'mlflow.db'}"


def job_runs(uri: str, experiment: str = "cupid") -> list[Any]:
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    return [r for r in client.search_runs([found.experiment_id]) if r.data.tags.get("cupid.kind") == "job"]


def only_run(uri: str) -> Any:
    (run,) = job_runs(uri)
    return run


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)]


def traces_of(uri: str, run: Any) -> list[Any]:
    """The run's traces, spans included (the job flushed its export before it ended the run)."""
    client = MlflowClient(uri)
    return list(client.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, max_results=500))


# Ctrl-C at its default in the job, as a terminal starts it, even when this suite runs in the background: a
# non-interactive shell's `cmd &` ignores SIGINT for cmd and everything it starts (the job would sit out SIGINT)
# The job as a terminal starts it: Ctrl-C and a closed terminal (SIGHUP) at their defaults, whatever the test run
# inherited (a suite started under ``nohup`` ignores SIGHUP, and the job rightly keeps an ignored SIGHUP ignored).
_DEFAULT_SIGINT = ("import os, signal, sys; "
                   "[signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGHUP)]; "
                   "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def start(cmd: list[str], log: Path, *, new_session: bool = False, **env: str) -> subprocess.Popen:
    """The CLI job, its output into ``log``; ``new_session``: in a process group of its own (``os.killpg``)."""
    out = log.open("w")
    if cmd[0] == sys.executable:
        cmd = [sys.executable, "-c", _DEFAULT_SIGINT, *cmd[1:]]
    return subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=cli_env(**env), stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=new_session)


@contextmanager
def held_job(stub: Any, cmd: list[str], log: Path, after: int, timeout: float = 120) -> Iterator[subprocess.Popen]:
    """The CLI job ``cmd`` started with the stub holding every response after ``after`` completed ones; yields
    the process once a request is held. On the way out the process is killed if still running (after a
    SIGABRT that has its threads' stacks written into ``log``, printed here: what it was stuck on), and the stub
    released."""
    import signal

    stub.hold_after(after)
    proc = start(cmd, log, PYTHONFAULTHANDLER="1")
    try:
        assert stub.wait_held(timeout=timeout), log.read_text()[-3000:]
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGABRT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            print(f"--- the job was still running; its log ({log}):\n{log.read_text()[-12000:]}")
        stub.release()


def wait_for(what: Callable[[], Any], timeout: float, message: str = "") -> Any:
    """Poll ``what`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = what()
        except Exception:  # noqa: BLE001  # the store may not exist yet
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {message or what}")


def held_job_settled(stub: Any) -> int:
    """Requests received once a held job sends no more: all it has in flight held, the count unchanged for half a
    second (its other units' calls may still go out after the first is held)."""
    def quiet() -> int | None:
        first = stub.stats()
        time.sleep(0.5)
        then = stub.stats()
        same = first["total_received"] == then["total_received"] and then["in_flight"] == then["held"]
        return then["total_received"] if same else None

    return wait_for(quiet, 60, "the held job to stop sending")
