"""A dry run calls no model, and its call counts equal what the real run then makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli_runner import cli_command, run_job

from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.inprocess import InProcessModel

pytestmark = pytest.mark.slow


def job_metrics(output_root: Path) -> dict[str, float]:
    [path] = list(output_root.glob("runs/*/*/metrics.json"))
    return json.loads(path.read_text())["metrics"]


@pytest.mark.parametrize("task,setting", [("both", "standard"), ("both", "summary"),
                                          ("generation", "oracle_preference")])
def test_dry_run_counts_equal_the_real_runs_calls(tmp_path: Path, task: str, setting: str) -> None:
    data = write_dataset(tmp_path / "data.jsonl", 6)
    with InProcessModel() as stub:
        common = [f"task={task}", f"setting={setting}", "calls.cache=false"]
        dry = run_job(cli_command(stub, tmp_path / "dry", *common, "calls.dry_run=true", data=data))
        assert stub.stats()["total_received"] == 0, "a dry run must not call any model"
        assert "DRY RUN" in dry.stdout and not (tmp_path / "dry" / "mlflow.db").exists()
        run_job(cli_command(stub, tmp_path / "real", *common, data=data))
        real_calls = stub.stats()["completed"]
    planned, made = job_metrics(tmp_path / "dry"), job_metrics(tmp_path / "real")
    steps = {k.split("/")[1] for k in made if k.startswith("calls/") and k.count("/") == 1
             and k not in ("calls/total", "calls/retries", "calls/unpriced", "calls/gave_up", "calls/cache_hits")}
    assert steps, made
    for step in steps:
        assert planned[f"calls/{step}"] == made[f"calls/{step}"], step
    assert planned["calls/total"] == made["calls/total"] == sum(real_calls.values())
    assert planned["tokens/prompt"] > 0
