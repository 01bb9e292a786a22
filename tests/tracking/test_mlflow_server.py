"""Against a real `mlflow server`: a job that only has $MLFLOW_TRACKING_URI logs its run, metrics, traces and
artifacts there, and the artifacts land in the server's artifact store, not in a folder on the client."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers.cli_runner import cli_env, run_cli, run_job
from helpers.mlflow_server import free_port, kill, serve
from helpers.tracking_runs import job_command, only_run, traces_of
from mlflow.tracking import MlflowClient

from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.stub_llm_server import StubServer

pytestmark = pytest.mark.slow  # a real server

N = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`mlflow server` on 127.0.0.1 with a SQLite backend and its own artifact store (LITELLM_LOCAL_MODEL_COST_MAP
    keeps it from deadlocking offline); killed at the end."""
    tmp = tmp_path_factory.mktemp("server")
    port, artifacts = free_port(), tmp / "artifact-store"
    proc = serve(tmp, port, cli_env(), artifacts=artifacts)
    try:
        yield {"url": f"http://127.0.0.1:{port}", "artifacts": artifacts}
    finally:
        kill(proc)


def test_a_job_logs_everything_to_the_server_named_by_the_environment(server, tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    root = tmp_path / "out"
    env = cli_env(MLFLOW_TRACKING_URI=server["url"])
    with StubServer() as stub:
        # in this process: the variable is the point, not the process
        proc = run_job(job_command(stub.url, root, data, seed=False), env=env, park=False)
    assert f"at {server['url']}" in proc.stdout
    assert not (root / "mlflow.db").exists() and not (root / "mlartifacts").exists()  # nothing on the client

    client = MlflowClient(server["url"])
    experiment = client.get_experiment_by_name("cupid")
    assert experiment.artifact_location.startswith("mlflow-artifacts:")  # the server decides
    run = only_run(server["url"])
    assert run.info.status == "FINISHED" and run.data.metrics["calls/total"] == 4 * N
    assert len(client.get_metric_history(run.info.run_id, "progress/instances_done")) >= 2
    assert [d.dataset.name for d in run.inputs.dataset_inputs] == ["data.jsonl"]
    assert len(traces_of(server["url"], run)) == N
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"instances.jsonl", "metrics.json", "config.yaml", "plots"} <= names
    stored = list(server["artifacts"].rglob(f"{run.info.run_id}/artifacts/instances.jsonl"))
    assert len(stored) == 1 and stored[0].read_text().count("\n") == N  # in the server's store, on its disk

    # the report honours the variable too
    report = run_cli([sys.executable, "-m", "cupid_exp.report", "--n-boot", "50", "--cache-dir",
                      str(tmp_path / "cache")], env=env, timeout=120)
    assert "openai_compatible" in report.stdout and run.info.run_id[:8] in report.stdout
