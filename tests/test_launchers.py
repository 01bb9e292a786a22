"""Scale-out: real 2-job sweeps of the real CLI through Hydra's joblib and submitit (local) launchers.

Each sweep runs one instance against the stub model server with ``runtime.failure_policy=exclude,zero``:
two jobs that make the same model calls, so once a warm-up job has filled the shared response
cache every call of both is a cache hit. What is checked is the plumbing: both jobs ran in worker processes, logged
one MLflow run each under the sweep's parent run (whose id the sweep callback wrote into the
sweep dir), and their job dirs and runs diff to exactly the swept override.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from cupid_exp.reporting.diff import diff_runs, spec_from_job_dir, spec_from_mlflow
from cupid_exp.testing.cupid_data import stub_overrides
from cupid_exp.testing.stub_llm_server import StubServer
from cupid_exp.tracking.mlflow import PARENT_RUN_FILE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stub():
    with StubServer() as server:
        yield server


def cli(args: list[str], cwd: Path, output_root: Path, cache_dir: Path, url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "cupid_exp", *args, *stub_overrides(url), "data.limit=1",
           f"paths.output_root={output_root}", f"calls.cache_dir={cache_dir}"]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory, stub) -> Path:
    """A response cache filled by one plain job, so the sweeps' identical calls are cache hits."""
    cache = tmp_path_factory.mktemp("llm-cache")
    root = tmp_path_factory.mktemp("warm")
    cli(["tracking=none"], root, root / "outputs", cache, stub.url)
    return cache


def check_sweep(output_root: Path) -> tuple[list, Path]:
    uri = f"sqlite:///{output_root / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("cupid")
    found = client.search_runs([experiment.experiment_id])
    parents = [r for r in found if r.data.tags.get("cupid.kind") == "sweep"]
    children = [r for r in found if r.data.tags.get("cupid.kind") == "job"]
    assert len(parents) == 1 and len(children) == 2
    sweep_dir = Path(parents[0].data.tags["cupid.sweep_dir"])
    assert (sweep_dir / PARENT_RUN_FILE).read_text().strip() == parents[0].info.run_id
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert all(c.info.status == "FINISHED" for c in children) and parents[0].info.status == "FINISHED"
    assert sorted(c.data.params["runtime.failure_policy"] for c in children) == ["exclude", "zero"]
    assert all(c.data.metrics["inference/count/instances"] == 1 for c in children)
    # each job's status in the sweep's folder names the folder of its experiment (``runs/<name>/<fingerprint>``)
    statuses = sorted(sweep_dir.glob("*/job_status.json"))
    assert [p.parent.name.split("_")[0] for p in statuses] == ["0", "1"]
    job_dirs = [Path(json.loads(p.read_text())["folder"]) for p in statuses]
    assert len(set(job_dirs)) == 2
    assert all((p / ".hydra" / "config.yaml").exists() and (p / "instances.jsonl").exists() for p in job_dirs)

    # the two jobs differ by exactly the swept value, from their job dirs and from their MLflow runs
    diff = diff_runs(spec_from_job_dir(job_dirs[0]), spec_from_job_dir(job_dirs[1]))
    assert diff.verified and diff.overrides == ["runtime.failure_policy=zero"]
    by_policy = {c.data.params["runtime.failure_policy"]: c.info.run_id for c in children}
    diff = diff_runs(spec_from_mlflow(by_policy["zero"], uri), spec_from_mlflow(by_policy["exclude"], uri))
    assert diff.verified and diff.overrides == ["runtime.failure_policy=exclude"]
    return children, sweep_dir


def test_joblib_launcher_runs_jobs_in_parallel_workers(tmp_path: Path, cache_dir: Path, stub) -> None:
    proc = cli(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "runtime.failure_policy=exclude,zero"],
               tmp_path, tmp_path / "outputs", cache_dir, stub.url)
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout + proc.stderr
    children, _ = check_sweep(tmp_path / "outputs")
    # the two jobs make the same calls (same identity, one journal): one runs them, served from the warm cache (cache
    # hits, no call billed), the other waits for the job's lock and replays the journal (durability.job_lock)
    ran = [c for c in children if c.data.metrics["resume/instances_from_journal"] == 0]
    assert len(ran) == 1 and ran[0].data.metrics["calls/cache_hits"] > 0
    assert all(c.data.metrics["calls/total"] == 0 for c in children)


def test_submitit_local_launcher_runs_jobs_as_submitit_jobs(tmp_path: Path, cache_dir: Path, stub) -> None:
    proc = cli(["-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=20",
                "runtime.failure_policy=exclude,zero"], tmp_path, tmp_path / "outputs", cache_dir, stub.url)
    assert "Submitit 'local' sweep output dir" in proc.stdout + proc.stderr
    children, sweep_dir = check_sweep(tmp_path / "outputs")
    logs = list((sweep_dir / ".submitit").glob("*/*_log.out"))
    assert len(logs) == 2  # each job ran as its own submitit job
    assert any("CUPID inference | model=openai_compatible" in p.read_text() for p in logs)
