"""Parallel jobs on one SQLite MLflow store and one response cache.

A 4-job sweep through Hydra's joblib launcher (4 worker processes at once) must end with 4 complete
child runs under one parent and no 'database is locked' (or any other) store error; and jobs that
start together on a store that does not exist yet must not trip over each other creating its schema.
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers.cli_runner import PROJECT_ROOT, cli_command, job_dirs, metrics_of, read_jsonl, run_cli

from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.stub_llm_server import StubServer

pytestmark = pytest.mark.slow

TEMPERATURES = (0, 0.1, 0.2, 0.3)


def test_joblib_sweep_of_four_jobs_shares_one_store_and_one_cache(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    n = 4
    data = write_dataset(tmp_path / "data.jsonl", n)
    root, cache = tmp_path / "out", tmp_path / "cache"
    with StubServer(latency_ms=20) as stub:
        cmd = cli_command(stub.url, root, cache_dir=cache, data=data)
        proc = run_cli([*cmd[:3], "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=4", *cmd[3:],
                        "model.params.temperature=" + ",".join(map(str, TEMPERATURES))], timeout=300)
        st = stub.stats()
    output = proc.stdout + proc.stderr
    assert "Joblib.Parallel(n_jobs=4" in output
    for problem in ("database is locked", "OperationalError", "Traceback"):
        assert problem not in output, output[-4000:]

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    found = client.search_runs([client.get_experiment_by_name("cupid").experiment_id])
    parents = [r for r in found if r.data.tags.get("cupid.kind") == "sweep"]
    children = [r for r in found if r.data.tags.get("cupid.kind") == "job"]
    assert len(parents) == 1 and len(children) == len(TEMPERATURES)
    assert parents[0].info.status == "FINISHED"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert sorted(float(c.data.params["model.params.temperature"]) for c in children) == list(TEMPERATURES)
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.metrics["inference/count/instances"] == n
        assert child.data.metrics["inference/count/scored"] == n
        artifacts = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"instances.jsonl", "metrics.json", "config.yaml"} <= artifacts

    dirs = job_dirs(root)  # each job in its experiment's folder (runs/)
    assert len(dirs) == len(TEMPERATURES)
    assert all(len(read_jsonl(d / "instances.jsonl")) == n for d in dirs)
    # one shared cache: the subject calls differ by temperature, the evaluator calls are shared
    totals = [metrics_of(d) for d in dirs]
    sent = sum(m["calls/total"] for m in totals)  # a cache hit is not a call
    assert st["total_completed"] >= n * len(TEMPERATURES)  # every job's own inference calls
    assert sent == st["total_completed"]  # what the jobs did not find in the cache, the stub answered


def _log_one(root: Path, i: int, start_at: float) -> str:
    from hydra import compose, initialize_config_dir

    from cupid_exp.config_store import register_configs
    from cupid_exp.job import typed_config
    from cupid_exp.tracking.mlflow import RunTracker

    register_configs()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.output_root={root}"])
    time.sleep(max(0.0, start_at - time.time()))
    try:
        tracker = RunTracker(typed_config(cfg).tracking)
        tracker.start(run_name=f"job{i}", params={}, tags={}, parent=None, config={})
        tracker.log_metrics({"inference/f1": i / 10})
        tracker.log_table(pd.DataFrame([{"key": f"p{i}/consistent", "f1": i / 10}]), "instances_table.json")
        tracker.end()
        return "ok"
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"[:300]


def test_jobs_starting_together_on_a_fresh_store_all_log(tmp_path: Path) -> None:
    import mlflow  # noqa: F401  # imported once here; the forked workers share it
    from mlflow.tracking import MlflowClient

    root = tmp_path / "out"
    assert not (root / "mlflow.db").exists()
    start_at = time.time() + 3
    with multiprocessing.get_context("fork").Pool(4) as pool:
        results = pool.starmap(_log_one, [(root, i, start_at) for i in range(4)])
    assert results == ["ok"] * 4
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("cupid").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["job0", "job1", "job2", "job3"]


def test_jobs_run_one_after_another_in_one_process_each_call_models_in_its_own_event_loop(tmp_path: Path) -> None:
    """Hydra's basic launcher runs a sweep's jobs in one process, each in its own event loop; litellm's clients
    (its cached HTTP clients among them) made in the first job's loop must still work in the next."""
    data = write_dataset(tmp_path / "data.jsonl", 3)
    root = tmp_path / "out"
    with StubServer() as stub:
        cmd = cli_command(stub.url, root, "tracking=none", "calls.cache=false", data=data)
        proc = run_cli([*cmd[:3], "-m", *cmd[3:], "runtime.reask=1,2"])  # two jobs: both call the model
        st = stub.stats()
    assert st["total_completed"] == st["total_received"] == 2 * 3 * 4  # both jobs called the model, no errors
    dirs = job_dirs(root)
    assert len(dirs) == 2 and all(metrics_of(d)["inference/count/scored"] == 3 for d in dirs)
    assert "Traceback" not in proc.stderr
