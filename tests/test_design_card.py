"""The command this project exists for, as a researcher with API keys runs it (the keys' calls sent to the
stub server): ``python -m cupid_exp -m model=gpt4o,claude setting=oracle,summary`` composes, runs, and
names the evaluator that ran (the paper's GPT-4o protocol) in the header and in MLflow; and a preset's
runs line up with the paper's rows in ``python -m cupid_exp.report --reference paper``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from helpers.cli_runner import PROJECT_ROOT, cli_env, job_dirs, run_cli, seed_store

from cupid_exp.testing.cupid_data import sample_rows, write_jsonl
from cupid_exp.testing.stub_llm_server import StubServer

KEYS = {"OPENAI_API_KEY": "sk-test-openai", "ANTHROPIC_API_KEY": "sk-test-anthropic"}


def at_stub(url: str) -> list[str]:
    """Every endpoint's address and route at the stub; models, evaluator and decoding stay as shipped."""
    out = ["model.litellm_model=openai/stub", f"model.api_base={url}"]
    for role in ("decomposer", "matcher", "judge"):
        out += [f"evaluator.{role}.litellm_model=openai/stub", f"evaluator.{role}.api_base={url}"]
    return out


def sweep(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, str]:
    data = write_jsonl(tmp_path / "small.jsonl", sample_rows()[:3])
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    seed_store(tmp_path)  # the store at ``uri``, already made
    # a process of its own: in this one the job and the stub's server thread share one interpreter (slower here)
    with StubServer() as stub:
        proc = run_cli([sys.executable, "-m", "cupid_exp", "-m", *overrides, *at_stub(stub.url), "data=local",
                        f"data.path={data}", f"paths.output_root={tmp_path / 'out'}", f"tracking.uri={uri}",
                        "runtime.progress=false"], env=cli_env(**KEYS), timeout=600)
    return proc, uri


@pytest.mark.slow
def test_the_design_card_command_runs_with_the_papers_evaluator(tmp_path: Path) -> None:
    proc, uri = sweep(tmp_path, "model=gpt4o,claude", "setting=oracle,summary")
    headers = sorted(line for line in proc.stdout.splitlines() if line.startswith("CUPID inference |"))
    assert headers == sorted(f"CUPID inference | model={m} setting={s} evaluator=gpt4o data=local"
                             for m in ("gpt4o", "claude37") for s in ("oracle", "summary"))
    assert proc.stdout.count("complete: 3 of 3 instances") == 4
    assert len(job_dirs(tmp_path / "out")) == 4
    mlflow.set_tracking_uri(uri)
    try:
        runs = mlflow.search_runs(experiment_names=["cupid"], filter_string="params.`model.name` != ''")
    finally:
        mlflow.set_tracking_uri(None)
    assert len(runs) == 4
    assert set(runs["params.evaluator.name"]) == {"gpt4o"} and set(runs["params.choice.evaluator"]) == {"gpt4o"}
    assert set(runs["params.evaluator.judge.litellm_model"]) == {"openai/stub"}  # routed to the stub
    assert set(runs["params.choice.model"]) == {"gpt4o", "claude"}


@pytest.mark.slow
def test_a_presets_runs_line_up_with_the_papers_rows(tmp_path: Path) -> None:
    proc, uri = sweep(tmp_path, "+experiment=table1", "model=gpt4o,claude37")
    headers = [line for line in proc.stdout.splitlines() if line.startswith("CUPID inference |")]
    assert len(headers) == 4 and all("evaluator=gpt4o" in h for h in headers)  # 2 models x 2 settings
    report = subprocess.run([sys.executable, "-m", "cupid_exp.report", "--reference", "paper", "--tracking-uri", uri],
                            cwd=PROJECT_ROOT, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    table = report.stdout.split("### Inference by model")[1].split("###")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("| ")]
    header, body = rows[0], rows[1:]  # the |:---| line does not start with "| "
    names = [r[0] for r in body]
    for model, paper in (("claude37", "paper: Claude 3.7 Sonnet"), ("gpt4o", "paper: GPT-4o")):
        ours = body[names.index(model)]
        assert names[names.index(model) + 1] == paper  # the paper's row right under the run's
        assert all(ours[header.index(c)] != "–" for c in ("all", "consistent", "contrastive", "changing", "oracle"))
    assert body[names.index("paper: GPT-4o")][header.index("all")] == "36.6 / 52.1 / 43.0"
    assert body[names.index("paper: Claude 3.7 Sonnet")][header.index("oracle")] == "69.6 / 84.5 / 76.3"
