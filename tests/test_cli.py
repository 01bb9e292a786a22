"""End to end: the real CLI against the stub model server on 127.0.0.1, into a real SQLite MLflow store.

(The embedded local model's own smoke runs are in tests/test_local_demo.py.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.cli_runner import cli_command, job_dirs, read_jsonl, run_cli
from helpers.cupid_data import stub_overrides
from helpers.stub_llm_server import StubServer
from mlflow.tracking import MlflowClient


@pytest.fixture(scope="module")
def stub():
    with StubServer() as server:
        yield server


def runs(outputs: Path):
    client = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cupid")
    return client, client.search_runs([experiment.experiment_id])


def test_a_run_scores_instances_logs_one_mlflow_run_and_reruns_for_free(tmp_path: Path, stub) -> None:
    root, cache = tmp_path / "outputs", tmp_path / "cache"
    proc = run_cli(cli_command(stub.url, root, "data.limit=2", cache_dir=cache))
    assert "CUPID inference | model=openai_compatible setting=standard evaluator=local data=sample" in proc.stdout
    assert "inference instances: 2 run, 2 scored, 0 failed" in proc.stdout
    (job,) = job_dirs(root)
    records = read_jsonl(job / "instances.jsonl")
    assert [r["key"] for r in records] == ["1+high_school_chemistry_teacher/consistent",
                                           "1+high_school_chemistry_teacher/contrastive"]
    for r in records:
        assert r["raw"]["infer"], "the subject model's raw reply is kept"
        assert r["usage"]["infer"]["prompt_tokens"] > 500  # the 8-session log was really sent
        assert 0 <= r["precision"] <= 1 and 0 <= r["recall"] <= 1
        assert len(r["precision_labels"]) == len(r["inferred_checklist"])
        assert len(r["recall_labels"]) == len(r["gt_checklist"])
    metrics = json.loads((job / "metrics.json").read_text())["metrics"]
    assert metrics["inference/count/failed"] == 0 and metrics["inference/count/instances"] == 2

    client, found = runs(root)
    (run,) = found
    assert run.data.params["model.name"] == "openai_compatible" and run.data.params["choice.setting"] == "standard"
    assert run.data.metrics["inference/count/instances"] == 2 and run.data.metrics["calls/infer"] == 2
    assert {"git_commit", "git_dirty", "dataset_digest", "prompts_digest", "cupid.complete"} <= set(run.data.tags)
    assert run.info.status == "FINISHED" and run.data.tags["cupid.complete"] == "true"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "instances.jsonl", "metrics.json", "instances_table.json", "plots"} <= artifacts

    # an identical rerun finds every instance in the resume journal and calls nothing
    resumed = run_cli(cli_command(stub.url, root, "data.limit=2", cache_dir=cache))
    assert "calls: 0 ok (0 cached)" in resumed.stdout
    latest = max(job_dirs(root), key=lambda p: p.stat().st_mtime)
    assert json.loads((latest / "metrics.json").read_text())["metrics"]["resume/instances_from_journal"] == 2
    # without the journal, the same calls are served from the response cache
    again = run_cli(cli_command(stub.url, root, "data.limit=2", "runtime.resume=false", cache_dir=cache))
    assert "calls: 8 ok (8 cached), 0 failed; requests sent: 0" in again.stdout


def test_settings_sweep_and_oracle_preference_each_log_a_run(tmp_path: Path, stub) -> None:
    root = tmp_path / "outputs"
    cmd = cli_command(stub.url, root, "data.limit=1")
    run_cli([*cmd[:3], "-m", *cmd[3:], "task=both", "setting=standard,oracle,summary"])
    run_cli(cli_command(stub.url, root, "data.limit=1", "task=generation", "setting=oracle_preference"))
    _, found = runs(root)
    jobs = [r for r in found if r.data.tags.get("cupid.kind") == "job"]
    by_setting = {r.data.params["setting.name"]: r for r in jobs}
    assert sorted(by_setting) == ["oracle", "oracle_preference", "standard", "summary"]
    for name, run in by_setting.items():
        assert run.data.metrics["generation/count/instances"] == 1
        assert run.data.metrics["generation/count/scored"] == 1
        if name != "oracle_preference":
            assert run.data.metrics["inference/count/scored"] == 1
    assert by_setting["summary"].data.metrics["calls/summarize"] == 1  # one summary shared by both tasks
    record = json.loads(Path(by_setting["oracle"].data.tags["output_dir"], "instances.jsonl").read_text())
    assert record["n_context_sessions"] == 2
    summary = json.loads(Path(by_setting["summary"].data.tags["output_dir"], "instances.jsonl").read_text())
    assert summary["raw"]["summarize"] and len(summary["summaries"]) == 8


def test_impossible_combination_stops_before_any_call(tmp_path: Path) -> None:
    proc = run_cli([sys.executable, "-m", "cupid_exp", "task=inference", "setting=oracle_preference",
                    f"paths.output_root={tmp_path / 'outputs'}"], check=False)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("cupid_exp:")]
    assert len(lines) == 1 and "setting=oracle_preference is defined for generation only" in lines[0]
    assert not (tmp_path / "outputs" / "mlflow.db").exists()


def test_prefmatcher_evaluator_serves_and_scores(tmp_path: Path, stub) -> None:
    """evaluator=prefmatcher with the runner starting its model server: a second stub server stands in for
    vLLM (which needs a GPU and the Hub); the decomposer and judge are the first stub (no key here)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = Path(__file__).parent / "helpers" / "stub_llm_server.py"
    # subject, decomposer, judge at the stub; its evaluator=local would win over evaluator=prefmatcher
    overrides = [o for o in stub_overrides(stub.url) if "matcher" not in o and not o.startswith("evaluator=")]
    proc = run_cli([sys.executable, "-m", "cupid_exp", "evaluator=prefmatcher", *overrides,
                    "evaluator.server.serve=true", f"evaluator.server.base_url=http://127.0.0.1:{port}",
                    f"evaluator.server.command=[{sys.executable},{server},--port,{port}]",
                    f"evaluator.matcher.api_base=http://127.0.0.1:{port}/v1", "data.limit=1",
                    f"paths.output_root={tmp_path / 'outputs'}", "runtime.progress=false"])
    assert "evaluator=prefmatcher" in proc.stdout
    _, (run,) = runs(tmp_path / "outputs")
    assert run.data.metrics["inference/count/scored"] == 1 and run.data.metrics["calls/match_recall"] == 1
    record = read_jsonl(next((tmp_path / "outputs" / "runs").glob("*/*/instances.jsonl")))[0]
    assert record["raw"]["match_recall"] and not record["errors"]
    assert run.data.params["evaluator.matcher_prompt"] == "evaluation/preference_matcher_model"


def test_retrieval_sweep_beside_standard_and_oracle(tmp_path: Path, stub) -> None:
    root = tmp_path / "outputs"
    cmd = cli_command(stub.url, root, "data.limit=2")
    base = [*cmd[:3], "-m", *cmd[3:]]
    run_cli([*base, "setting=standard,oracle"])
    run_cli([*base, "setting=retrieval", "setting.retriever=bm25,recency"])
    run_cli([*base, "setting=standard,oracle", "tracking.run_name=again"])  # same identity: replayed
    _, found = runs(root)
    jobs = [r for r in found if r.data.tags.get("cupid.kind") == "job"]
    assert len(jobs) == 4  # the replay found the standard and oracle jobs done (one run per job)
    retrieval = {r.data.params["setting.retriever"]: r for r in jobs if r.data.params["setting.name"] == "retrieval"}
    assert sorted(retrieval) == ["bm25", "recency"]
    for run in retrieval.values():
        assert 0.0 <= run.data.metrics["retrieval/recall_at_k"] <= 1.0
        assert "retrieval/consistent/recall_at_k" in run.data.metrics
    # the first two sample instances: oracle sessions [1, 2]; recency takes [7, 8]
    assert retrieval["recency"].data.metrics["retrieval/recall_at_k"] == 0.0
    others = [r for r in jobs if r.data.params["setting.name"] != "retrieval"]
    assert all("retrieval/recall_at_k" not in r.data.metrics for r in others)
    # their runs, which hold their results, are left as they were: the replay's sweep links to them
    links = [r for r in found if r.data.tags.get("cupid.kind") == "link"]
    assert sorted(r.data.tags["cupid.links_to"] for r in links) == sorted(r.info.run_id for r in others)
    assert all(r.data.tags["cupid.attempt"] == "1" for r in others)
