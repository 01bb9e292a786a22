"""MLflow's runs list tells runs apart: a job run's name says what distinguishes it, a sweep's parent what the
sweep varied (``cupid_exp.tracking.mlflow``). The names of whole jobs' runs, their results and the links of a
sweep are checked where those jobs run (test_live.py, test_finished_runs.py)."""

from __future__ import annotations

from pathlib import Path

from conftest import compose_config
from helpers.jobs import stub_plan
from mlflow.tracking import MlflowClient

from cupid_exp.tracking import mlflow as names


def test_a_job_runs_name_carries_its_decoding_choices_subset_and_epochs(tmp_path: Path, monkeypatch) -> None:
    given = ["model.params.temperature=0.4", "data.limit=2", "runtime.workers=2", "model.pool.rpm=10"]
    monkeypatch.setattr(names, "hydra_overrides", lambda: given)  # as Hydra hands a job its command's overrides
    job = stub_plan("http://127.0.0.1:9", tmp_path, *given)
    name = job.work.tracking.run_name
    evaluator = job.cfg.evaluator.name
    # pacing and processes change no score: not in the name; the subset reads as a part of the data
    assert name == (f"openai_compatible · inference · standard · eval {evaluator} · cupid-sample [data.limit=2]"
                    " · temperature=0.4")
    named = names.job_run_name("m", "inference", "oracle", "e", "local", "", ["evaluator.judge.params.seed=3"],
                               epochs=3)
    assert named == "m · inference · oracle · eval e · local · evaluator.judge.params.seed=3 · 3 epochs"
    # a job that finished gets its results after its name; a resumed one's earlier results are replaced
    scored = names.scored_name(name, "inference f1 0.500 · $0.0100 · 2 of 2 instances")
    assert names.scored_name(scored, "x") == f"{name} | x"


def test_a_sweeps_parent_records_its_overrides_as_params_without_secrets(tmp_path: Path) -> None:
    from cupid_exp.tracking.mlflow import ensure_parent

    cfg = compose_config([f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    secret = "sk-proj-abcdefghijklmnop1234567890"
    parent = ensure_parent(cfg.tracking, tmp_path / "sweep", ["model.params.temperature=0,0.2", "data.limit=2",
                                                               f"model.api_key={secret}"])
    run = MlflowClient(cfg.tracking.uri).get_run(parent)
    params = run.data.params
    assert params["sweep.model.params.temperature"] == "0,0.2" and params["sweep.data.limit"] == "2"
    assert secret not in str(params) and "sweep.model.api_key" in params
    assert run.info.run_name == "sweep sweep · model.params.temperature=0,0.2"  # what it varied, at a glance
