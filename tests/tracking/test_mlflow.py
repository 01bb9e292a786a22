"""MLflow logging: secrets redacted, params/tags/metrics/artifacts present, sweeps nested, artifacts where the
store says, the tracking URI from the environment."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from conftest import compose_config
from helpers.tracking_runs import wait_for
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from cupid_exp.job import typed_config
from cupid_exp.secrets import redact
from cupid_exp.tracking.callbacks import MlflowSweepCallback
from cupid_exp.tracking.mlflow import RunTracker, flatten, parent_run_id


def tracked_run(cfg, *, run_name: str, params=None, metrics=None, parent=None, artifacts=(), table=None) -> str:
    tracker = RunTracker(typed_config(cfg).tracking, secrets=["sk-live-123"])
    tracker.start(run_name=run_name, params=params or {}, tags={"dataset_digest": "abc"}, parent=parent,
                  config={"model": {"api_key": "***"}})
    tracker.log_metrics(metrics or {})
    tracker.log_artifacts(artifacts)
    tracker.log_table(table, "instances_table.json")
    tracker.end()
    return tracker.run_id


def test_redact_hides_secret_values_but_keeps_names_and_token_counts() -> None:
    cfg = {"model": {"api_key": "sk-live-123", "api_key_env": "OPENAI_API_KEY",
                     "params": {"max_tokens": 10, "thinking": {"budget_tokens": 5}, "Authorization": "Bearer x"}},
           "list": [{"secret": "s3"}]}
    out = redact(cfg)
    assert out["model"]["api_key"] == "***" and out["list"][0]["secret"] == "***"
    assert out["model"]["params"]["Authorization"] == "***"
    assert out["model"]["api_key_env"] == "OPENAI_API_KEY"
    assert out["model"]["params"]["max_tokens"] == 10 and out["model"]["params"]["thinking"]["budget_tokens"] == 5
    assert "sk-live-123" not in str(out)


def test_flatten_paths_and_lists() -> None:
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": None}) == {"a.b": "1", "a.c": "[1, 2]", "d": "None"}


def test_a_run_records_config_params_metrics_tags_and_artifacts(tmp_path: Path) -> None:
    cfg = compose_config([f"paths.output_root={tmp_path}", "model=gpt4o"])
    (tmp_path / "instances.jsonl").write_text('{"key": "a/consistent"}\n')
    params = {"model.litellm_model": "openai/gpt-4o-2024-08-07", "choice.model": "gpt4o",
              "choice.llm@evaluator.judge": "local", "leak": "key sk-live-123 here"}
    run_id = tracked_run(cfg, run_name="unit", params=params, metrics={"inference/f1": 0.5, "nan": float("nan")},
                         table=pd.DataFrame([{"key": "a/consistent", "f1": 0.5}]),
                         artifacts=[tmp_path / "instances.jsonl"])
    client = MlflowClient(cfg.tracking.uri)
    run = client.get_run(run_id)
    assert run.data.params["model.litellm_model"] == "openai/gpt-4o-2024-08-07"
    assert run.data.params["choice.model"] == "gpt4o"
    assert run.data.params["choice.llm:evaluator.judge"] == "local"
    assert run.data.params["leak"] == "key *** here"
    assert run.data.metrics == {"inference/f1": 0.5}
    assert run.data.tags["dataset_digest"] == "abc" and "git_commit" in run.data.tags
    assert run.info.status == "FINISHED"
    names = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "instances.jsonl", "instances_table.json"} <= names
    assert Path(tmp_path / "mlartifacts").is_dir()  # artifacts land under outputs/, not the cwd


def test_sweep_callback_creates_and_closes_the_parent(tmp_path: Path) -> None:
    cfg = compose_config([f"paths.output_root={tmp_path}"], return_hydra_config=True)
    OmegaConf.update(cfg, "hydra.sweep.dir", str(tmp_path / "sweep"))
    callback = MlflowSweepCallback()
    callback.on_multirun_start(cfg)  # the run worker opens the parent while the first job starts
    parent = wait_for(lambda: parent_run_id(tmp_path / "sweep"), 120, "the sweep's parent run")
    child = tracked_run(compose_config([f"paths.output_root={tmp_path}"]), run_name="child", metrics={"x": 1.0},
                        parent=parent)
    callback.on_multirun_end(cfg)
    client = MlflowClient(cfg.tracking.uri)
    assert client.get_run(child).data.tags["mlflow.parentRunId"] == parent
    assert client.get_run(parent).info.status == "FINISHED"


def test_a_sweep_whose_worker_died_is_closed_by_the_launching_process(tmp_path: Path, caplog) -> None:
    """The worker that opened the parent is gone at the sweep's end: the leaderboard and the parent's end happen
    here instead, and the parent ends FINISHED (never left RUNNING)."""
    import logging

    from cupid_exp.tracking import run_worker

    cfg = compose_config([f"paths.output_root={tmp_path}"], return_hydra_config=True)
    OmegaConf.update(cfg, "hydra.sweep.dir", str(tmp_path / "sweep"))
    callback = MlflowSweepCallback()
    callback.on_multirun_start(cfg)
    parent = wait_for(lambda: parent_run_id(tmp_path / "sweep"), 120, "the sweep's parent run")
    worker = run_worker._IDLE
    worker.process.kill()
    worker.process.join(10)
    with caplog.at_level(logging.WARNING):
        callback.on_multirun_end(cfg)
    assert run_worker._IDLE is None
    client = MlflowClient(cfg.tracking.uri)
    assert client.get_run(parent).info.status == "FINISHED"
    assert "leaderboard.md" in {a.path for a in client.list_artifacts(parent)}


def test_artifacts_go_where_the_store_says(tmp_path: Path) -> None:
    """Beside a SQLite database; a server's own store (None: MLflow asks the server); a configured place as is."""
    from cupid_exp.config import TrackingConfig
    from cupid_exp.tracking.mlflow import artifact_location

    db = tmp_path / "outputs" / "mlflow.db"
    assert artifact_location(TrackingConfig(uri=f"sqlite:///{db}")) == (tmp_path / "outputs" / "mlartifacts").as_uri()
    assert artifact_location(TrackingConfig(uri="http://127.0.0.1:5000")) is None
    assert artifact_location(TrackingConfig(uri="https://mlflow.example.org")) is None
    assert artifact_location(TrackingConfig(uri="http://h:5000", artifact_location="s3://bucket/cupid")) == \
        "s3://bucket/cupid"
    assert artifact_location(TrackingConfig(uri="http://h:5000", artifact_location=str(tmp_path / "a"))) == \
        (tmp_path / "a").as_uri()


def test_the_job_config_honours_mlflow_tracking_uri(tmp_path: Path, monkeypatch) -> None:
    assert compose_config([f"paths.output_root={tmp_path}"]).tracking.uri == f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5055")
    assert compose_config([f"paths.output_root={tmp_path}"]).tracking.uri == "http://127.0.0.1:5055"
    given = compose_config([f"paths.output_root={tmp_path}", "tracking.uri=sqlite:///x.db"])
    assert given.tracking.uri == "sqlite:///x.db"  # an explicit tracking.uri wins
    assert typed_config(given).tracking.artifact_location is None and typed_config(given).tracking.traces is True


def test_our_own_set_tracking_uri_does_not_leak_into_the_environment(monkeypatch) -> None:
    import os

    import mlflow

    from cupid_exp.reporting.runs import env_uri_kept

    with env_uri_kept():
        mlflow.set_tracking_uri("sqlite:///leak.db")
    try:
        assert "MLFLOW_TRACKING_URI" not in os.environ
    finally:
        mlflow.set_tracking_uri(None)


def test_a_dataset_another_job_stored_meanwhile_is_linked_not_an_error(tmp_path: Path, monkeypatch) -> None:
    """Parallel jobs on the same data race to store its dataset: the loser's insert fails on MLflow's unique
    key (seen in a joblib sweep). The run then links the dataset the other job stored; other errors still raise."""
    import mlflow.data
    from mlflow.exceptions import MlflowException

    cfg = compose_config([f"paths.output_root={tmp_path}"])
    dataset = mlflow.data.from_pandas(pd.DataFrame([{"key": "a/consistent"}]), name="data.jsonl",
                                      digest="d1")._to_mlflow_entity()
    winner, loser = (RunTracker(typed_config(cfg).tracking, secrets=[]) for _ in range(2))
    for tracker, name in ((winner, "winner"), (loser, "loser")):
        tracker.start(run_name=name, params={}, tags={}, parent=None, config={})
    real = loser.client.log_inputs
    attempts = []

    def lose_the_race(run_id, inputs):
        attempts.append(run_id)
        if len(attempts) == 1:
            winner.log_input(dataset)  # the other job's insert lands between the lookup and ours
            raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, "
                                  "datasets.name, datasets.digest")
        return real(run_id, inputs)

    monkeypatch.setattr(loser.client, "log_inputs", lose_the_race)
    loser.log_input(dataset)
    client = MlflowClient(cfg.tracking.uri)
    linked = [client.get_run(t.run_id).inputs.dataset_inputs for t in (winner, loser)]
    assert len(attempts) == 2 and [[d.dataset.digest for d in inputs] for inputs in linked] == [["d1"], ["d1"]]

    def refused(run_id, inputs):
        raise MlflowException("the store is read-only")

    monkeypatch.setattr(loser.client, "log_inputs", refused)
    with pytest.raises(MlflowException, match="read-only"):
        loser.log_input(dataset)


def test_a_sweep_parent_marker_of_garbage_is_set_aside_and_a_new_parent_made(tmp_path: Path, caplog) -> None:
    """The marker a sweep's jobs read their parent run from, written over: no job takes garbage for a run id; the
    marker is renamed aside with one line and a new parent run is made (and named in a new marker)."""
    import logging

    from cupid_exp.tracking.mlflow import PARENT_RUN_FILE, ensure_parent

    cfg = compose_config([f"paths.output_root={tmp_path}"])
    marker = tmp_path / "sweep" / PARENT_RUN_FILE
    marker.parent.mkdir()
    marker.write_bytes(b"\x00\x17not a run id\xff")
    assert parent_run_id(marker.parent) is None  # the fault: the reader finds no run id in it
    with caplog.at_level(logging.WARNING, logger="cupid_exp.aside"):
        parent = ensure_parent(cfg.tracking, marker.parent)
    assert MlflowClient(cfg.tracking.uri).get_run(parent).data.tags["cupid.kind"] == "sweep"
    assert parent_run_id(marker.parent) == parent
    (aside,) = marker.parent.glob(f"{PARENT_RUN_FILE}.corrupt-*")
    assert aside.read_bytes() == b"\x00\x17not a run id\xff"
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"sweep parent marker {marker} is unreadable (not a run id): set aside as {aside.name}")
