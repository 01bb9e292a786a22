"""End to end: the real synthesis CLI on the real local model, then the instances through data=local."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from cupid_exp.config import DataConfig
from cupid_exp.data.loading import load_instances

pytestmark = pytest.mark.slow

# Small but complete: one persona, 13 sessions, 12 simulated dialogues, 3 instances, validation on.
FAST = ["synthesis.n_personas=1", "synthesis.max_turns=1", "synthesis.max_checklist_items=2",
        "synthesis.roles.assistant_simulator.params.max_tokens=96"]


def synthesize(args: list[str], root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "cupid_exp.synthesize", *args, f"paths.output_root={root / 'outputs'}",
           f"runtime.cache_dir={root / 'cache'}"]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_one_persona_synthesised_loaded_validated_and_resumed(tmp_path: Path) -> None:
    proc = synthesize(FAST, tmp_path)
    assert "personas: 1/1 completed" in proc.stdout, proc.stdout
    job = next((tmp_path / "outputs" / "synthesis").iterdir())

    journey = json.loads((job / "journeys" / "persona_001.json").read_text())
    assert len(journey["factors"]) == 8 and len(journey["sessions"]) == 13 and len(journey["dialogues"]) == 12
    for d in journey["dialogues"]:
        assert d["dialogue"][0]["role"] == "user" and d["dialogue"][1]["role"] == "assistant"
        assert len(d["scores"]) >= 1 and (d["is_satisfied"] == (d["dialogue"][-1]["role"] == "user"))
    personas = json.loads((job / "personas.json").read_text())
    assert personas[0]["persona_id"] == journey["persona"]["persona_id"] and personas[0]["status"] == "done"

    instances_path = job / "instances" / "instances.jsonl"
    data = load_instances(DataConfig(name="local", source="local", path=str(instances_path)))
    assert not data.errors
    assert sorted(i.instance_type for i in data.instances) == ["changing", "consistent", "contrastive"]
    assert all(len(i.prior_interactions) == 8 for i in data.instances)
    assert data.instances[0].persona_id.startswith("1+")
    import datasets

    assert len(datasets.load_dataset("json", data_files=str(instances_path), split="train")) == 3

    validation = json.loads((job / "validation.json").read_text())
    assert len(validation["instances"]) == 3
    assert (job / "validation.csv").exists()
    metrics = json.loads((job / "metrics.json").read_text())["metrics"]
    assert metrics["instances/count"] == 3 and metrics["validation/instances"] == 3
    assert metrics["validation/items"] > 0 and metrics["calls/total"] > 40

    client = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("cupid-synthesis").experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.data.metrics["instances/count"] == 3 and run.data.metrics["calls/total"] == metrics["calls/total"]
    assert "validation/items_expressed" in run.data.metrics and "tokens/prompt" in run.data.metrics
    assert run.data.params["synthesis.roles.user_simulator.params.temperature"] == "0.3"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"instances.jsonl", "personas.json", "validation.json", "metrics.json"} <= artifacts

    # A killed run: drop the later dialogues and everything after them, then rerun the same command.
    # It resumes in the same job dir, redoes only the missing sessions, and every call is a cache hit.
    path = job / "journeys" / "persona_001.json"
    for key in ("instances", "validation", "status"):
        journey.pop(key, None)
    journey["dialogues"][6:] = [None] * 6
    path.write_text(json.dumps(journey))
    again = synthesize(FAST, tmp_path)
    assert next((tmp_path / "outputs" / "synthesis").iterdir()) == job
    calls = json.loads((job / "metrics.json").read_text())["metrics"]
    assert 0 < calls["calls/total"] == calls["calls/cache_hits"] < metrics["calls/total"]
    assert "calls/persona" not in calls and "calls/session" not in calls  # finished phases were skipped
    assert (instances_path.read_text() == (job / "instances" / "instances.jsonl").read_text())
    assert "personas: 1/1 completed" in again.stdout
