"""Shared by the tracking tests: a priced stub job through the real CLI, and reading its MLflow run back."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from helpers.cli_runner import PROJECT_ROOT, cli_command, cli_env
from mlflow.tracking import MlflowClient

# Priced like gpt-4o, so cost is counted (litellm does not know the stub).
PRICES = [f"{role}.{kind}_cost_per_token={price}" for role in ("model", "evaluator.decomposer", "evaluator.matcher",
                                                               "evaluator.judge")
          for kind, price in (("input", "2.5e-06"), ("output", "1e-05"))]


def job_command(url: str, root: Path, data: Path, *extra: str, cache_dir: Path | None = None,
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


def start(cmd: list[str], log: Path, **env: str) -> subprocess.Popen:
    out = log.open("w")
    return subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=cli_env(**env), stdout=out, stderr=subprocess.STDOUT)


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
