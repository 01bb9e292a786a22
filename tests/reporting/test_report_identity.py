"""A decoding sweep reads as one row per identity: each temperature its own labelled row in the report and the
sweep's leaderboard, ``--compare`` naming the temperature, the sweep pairing its best two rows."""

from __future__ import annotations

from pathlib import Path

import mlflow
import mlflow.artifacts
import pytest
from helpers.records import make_records
from helpers.report_runs import log, sample_label
from mlflow.tracking import MlflowClient

from cupid_exp.report import main
from cupid_exp.scoring.bootstrap import bootstrap_ci
from cupid_exp.tracking.sweep import publish_sweep

TEMPERATURES = {"0": -0.1, "0.2": 0.0, "0.4": 0.12}  # temperature -> how well its run scores


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    """A gpt4o temperature sweep under one parent run, the 0.4 run made twice (the later one stands), and a
    claude37 run beside it."""
    root = tmp_path_factory.mktemp("identity")
    uri = f"sqlite:///{root}/mlflow.db"
    ids = {"claude37": log(root, ["model=claude37"], make_records(seed=2), name="claude37")}
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("cupid").experiment_id
    parent = client.create_run(experiment, run_name="sweep", tags={"cupid.kind": "sweep"}).info.run_id
    ids["0.4_first"] = log(root, ["model=gpt4o", "model.params.temperature=0.4"], make_records(seed=8, shift=-0.3),
                           name="t0.4_first", tags={"mlflow.parentRunId": parent})
    for temperature, shift in TEMPERATURES.items():
        ids[temperature] = log(root, ["model=gpt4o", f"model.params.temperature={temperature}"],
                               make_records(seed=1, shift=shift), name=f"t{temperature}",
                               tags={"mlflow.parentRunId": parent})
    mlflow.set_tracking_uri(None)
    return {"uri": uri, "root": root, "ids": ids, "parent": parent, "cache": root / "cache"}


def report(store, capsys, *args: str) -> str:
    assert main(["--tracking-uri", store["uri"], "--cache-dir", str(store["cache"]), "--n-boot", "200",
                 *args]) == 0
    return capsys.readouterr().out


def rows_of(markdown: str, title_start: str) -> dict[str, dict[str, str]]:
    block = markdown.split(f"### {title_start}")[1].split("###")[0]
    lines = [line for line in block.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return {cells[0]: dict(zip(header, cells, strict=False)) for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}


def test_a_temperature_sweep_is_one_labelled_row_per_temperature(store, capsys) -> None:
    out = report(store, capsys)
    rows = rows_of(out, f"Inference by model — data={sample_label()}, evaluator=local")
    assert list(rows) == ["claude37", "gpt4o · temperature=0", "gpt4o · temperature=0.2", "gpt4o · temperature=0.4"]
    for temperature, shift in TEMPERATURES.items():
        row = rows[f"gpt4o · temperature={temperature}"]
        assert row["runs"] == store["ids"][temperature][:8]
        assert row["all"].endswith(bootstrap_ci(make_records(seed=1, shift=shift), "f1", n_boot=200).fmt(100))
    # only a run of the same identity is replaced, and only it is called older
    first = store["ids"]["0.4_first"][:8]
    assert f"not used: {first}" in out and "older" in out.split(f"not used: {first}")[1].split("\n")[0]
    assert out.count("older") == 1


def test_compare_names_the_temperature(store, capsys) -> None:
    out = report(store, capsys, "--compare", store["ids"]["0"], store["ids"]["0.4"])
    assert "differs: model.params.temperature: 0 → 0.4; full config diff" in out
    same = report(store, capsys, "--compare", store["ids"]["0.4_first"], store["ids"]["0.4"])
    assert "differs: nothing that decides a score" in same


def test_the_sweeps_leaderboard_has_a_row_per_temperature_and_pairs_the_best_two(store, tmp_path: Path) -> None:
    client = MlflowClient(store["uri"])
    metrics = publish_sweep(client, store["uri"], "cupid", store["parent"], n_boot=200)
    assert metrics["sweep/jobs"] == 4 and metrics["sweep/jobs_in_tables"] == 3
    board = Path(mlflow.artifacts.download_artifacts(run_id=store["parent"], artifact_path="leaderboard.md",
                                                     dst_path=str(tmp_path), tracking_uri=store["uri"])).read_text()
    rows = rows_of(board, "Inference by model")
    assert list(rows) == [f"gpt4o · temperature={t}" for t in TEMPERATURES]
    # the best two rows (0.4 best, then 0.2), paired: B − A with the temperature named
    a, b = store["ids"]["0.2"][:8], store["ids"]["0.4"][:8]
    assert f"A = {a} (gpt4o, standard, inference), B = {b} (gpt4o, standard, inference)" in board
    assert "differs: model.params.temperature: 0.2 → 0.4" in board
    assert f"python -m cupid_exp.report --compare {a} {b}" in board
