"""A sweep reads as one experiment: the parent run carries the sweep's leaderboard table and comparison plots."""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import mlflow.artifacts
from helpers.cli_runner import cli_env, run_cli
from helpers.tracking_runs import PRICES, store_uri, traces_of
from mlflow.tracking import MlflowClient

from cupid_exp.testing.cupid_data import stub_overrides, write_dataset
from cupid_exp.testing.stub_llm_server import StubServer


def _processes_marked(mark: str) -> list[int]:
    """Processes whose environment carries ``CUPID_TEST_MARK=mark`` (zombies aside)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            marked = f"CUPID_TEST_MARK={mark}".encode() in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            if marked and Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_the_parent_run_has_the_sweeps_leaderboard_and_plots(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", 6)
    root = tmp_path / "out"
    mark = f"sweep-{uuid.uuid4().hex}"
    with StubServer() as stub:
        run_cli([sys.executable, "-m", "cupid_exp", "-m", *stub_overrides(stub.url), *PRICES,
                 f"paths.output_root={root}", "runtime.progress=false", "data=local", f"data.path={data}",
                 "model.name=stub_a,stub_b"], env=cli_env(CUPID_TEST_MARK=mark), timeout=300)
    # the MLflow worker the jobs shared quit with the sweep's process
    assert not _processes_marked(mark)
    uri = store_uri(root)
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("cupid").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("cupid.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("cupid.kind") == "job"]
    assert parent.info.status == "FINISHED" and len(children) == 2
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert parent.data.metrics["sweep/jobs"] == 2 and parent.data.metrics["sweep/jobs_in_tables"] == 2
    # the jobs ran one after the other in this process: each traced its own instances
    assert [len(traces_of(uri, c)) for c in children] == [6, 6]

    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"leaderboard.md", "leaderboard.html", "leaderboard", "plots"} <= names
    board = Path(mlflow.artifacts.download_artifacts(run_id=parent.info.run_id, artifact_path="leaderboard.md",
                                                     dst_path=str(tmp_path / "dl"), tracking_uri=uri)).read_text()
    rows = [line for line in board.splitlines() if line.startswith("| stub_")]
    assert [r.split("|")[1].strip() for r in rows] == ["stub_a", "stub_b"]
    for child in children:  # each model's F1 in the table is its run's, in %
        f1 = 100 * child.data.metrics["inference/f1"]
        assert any(row.startswith(f"| {child.data.params['model.name']} ") and f"{f1:.1f}" in row for row in rows)
    tables = [a.path for a in client.list_artifacts(parent.info.run_id, "leaderboard")]
    assert tables and all(p.endswith(".json") for p in tables)
    logged = json.loads(parent.data.tags["mlflow.loggedArtifacts"])  # MLflow's record of table artifacts
    assert any(entry["type"] == "table" for entry in logged)
    plots = [a.path for a in client.list_artifacts(parent.info.run_id, "plots")]
    assert len(plots) == 3 and all(p.endswith(".png") for p in plots)  # by type, by position, by history length
    page = Path(mlflow.artifacts.download_artifacts(run_id=parent.info.run_id, artifact_path="leaderboard.html",
                                                    dst_path=str(tmp_path / "dl"), tracking_uri=uri)).read_text()
    assert page.count("<img src='data:image/png;base64,") == 3  # the page carries its plots
