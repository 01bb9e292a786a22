"""A budget that holds, through the real CLI against the stub on 127.0.0.1 with priced model configs.

A budget hit mid-job sends no request past it, exits 4 with one BUDGET line and leaves the job incomplete; the
same command with a higher budget resumes and ends with the results of one uninterrupted run; parallel jobs of a
joblib sweep share one budget; an unpriced model is refused before any request; the dry run says whether its
estimate fits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli_runner import cli_command, job_dirs, read_jsonl, run_cli, run_job, scoring
from mlflow.tracking import MlflowClient

from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.inprocess import InProcessModel
from cupid_exp.testing.stub_llm_server import StubServer

N = 6
# $0.1 / $2 per million tokens and replies of at most 600 tokens: the stub's instances cost ~$0.0014 each, a call's
# worst case ~$0.002, so a budget of a few instances stops a job part-way with a few calls in flight
ROLES = ("model", "evaluator.decomposer", "evaluator.matcher", "evaluator.judge")
PRICES = [f"{role}.{key}={value}" for role in ROLES for key, value in (
    ("model_info.input_cost_per_token", 1e-7), ("model_info.output_cost_per_token", 2e-6), ("params.max_tokens", 600))]


def concurrency(n: int) -> list[str]:
    """Every role (one client: the same config) at ``n`` calls in flight: ``2n`` instances in flight. With all of a
    small data set in flight at once, none might finish before the budget stops them."""
    return [f"{role}.max_concurrency={n}" for role in ROLES]


def ledgers(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(root.rglob("*budget.json"))]


def budget_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("BUDGET:")]


def metrics_json(job: Path) -> dict:
    return json.loads((job / "metrics.json").read_text())


def test_a_budget_hit_mid_job_stops_it_and_a_higher_budget_resumes_to_the_results_of_one_run(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    root, budget = tmp_path / "out", 0.005
    with InProcessModel() as stub:
        run_job(cli_command(stub, tmp_path / "whole", "tracking=none", *PRICES, *concurrency(1), data=data,
                                    cache_dir=tmp_path / "whole-cache"))
        stub.reset()

        hit = run_job(cli_command(stub, root, *PRICES, *concurrency(1), f"calls.max_cost_usd={budget}", data=data,
                                  cache_dir=tmp_path / "cache"), check=False)
        sent = stub.stats()["total_received"]
        assert hit.returncode == 4, (hit.stdout[-2000:], hit.stderr[-2000:])
        (job,) = job_dirs(root)
        saved = metrics_json(job)
        m = saved["metrics"]
        # no request past the budget: what the stub was sent is what was paid, and that is within the budget
        assert sent == m["calls/requests"] > 0 and m["calls/not_sent_budget"] >= 1
        (state,) = ledgers(root)
        assert state["spent"] == pytest.approx(m["cost/usd"]) and 0 < state["spent"] <= budget
        assert state["reservations"] == {}
        not_run = int(m["budget/instances_not_run"])
        assert 0 < not_run < N and m["budget/job/spent_usd"] == pytest.approx(state["spent"])
        assert m["budget/job/left_usd"] == pytest.approx(budget - state["spent"])
        assert budget_lines(hit.stderr) == [f"BUDGET: ${state['spent']:.4f} of ${budget:.4f} spent; {not_run} "
                                            "instances not run; resume with a higher budget (calls.max_cost_usd)"]
        assert hit.stdout.rstrip().splitlines()[-1] == (f"INCOMPLETE: {not_run} instances not run: the budget was "
                                                        "reached: exit 4")
        assert saved["complete"] is False
        (journal,) = (root / "journal").glob("*.jsonl")
        assert len(read_jsonl(journal)) == N - not_run  # the rest is left to a resume
        client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
        (run,) = client.search_runs([client.get_experiment_by_name("cupid").experiment_id])
        assert run.data.tags["cupid.complete"] == "false" and run.info.status == "FAILED"
        assert run.data.tags["cupid.outcome"] == "budget" and run.data.tags["cupid.reason"].startswith("BUDGET: $")
        assert run.data.metrics["budget/job/spent_usd"] == pytest.approx(state["spent"])

        stub.reset()
        resumed = run_job(cli_command(stub, root, *PRICES, *concurrency(1), "calls.max_cost_usd=1", data=data,
                                      cache_dir=tmp_path / "cache"))
    assert f"resuming: {N - not_run} of {N} instances already finished" in resumed.stdout + resumed.stderr
    assert not budget_lines(resumed.stderr)
    latest = max(job_dirs(root), key=lambda p: p.stat().st_mtime)
    (whole_job,) = job_dirs(tmp_path / "whole")
    assert scoring(read_jsonl(latest / "instances.jsonl")) == scoring(read_jsonl(whole_job / "instances.jsonl"))
    # the job's ledger spans both attempts: together they paid what one uninterrupted run paid
    (state,) = ledgers(root)
    assert state["spent"] == pytest.approx(metrics_json(whole_job)["metrics"]["cost/usd"])
    (run,) = client.search_runs([client.get_experiment_by_name("cupid").experiment_id])
    assert run.data.tags["cupid.complete"] == "true" and run.info.status == "FINISHED"
    # the resume decided anew: no reason or description is left from the budget stop
    assert run.data.tags["cupid.outcome"] == "ok" and "cupid.reason" not in run.data.tags
    assert run.data.tags["mlflow.note.content"].endswith(f" · {N} of {N} instances")  # its results, at a glance
    assert run.data.metrics["budget/job/spent_usd"] == pytest.approx(state["spent"])


def test_parallel_sweep_jobs_share_one_budget_and_never_pass_it_together(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    # a job alone costs ~$0.0084: whichever job starts first cannot spend it all, the two together need more
    root, budget = tmp_path / "out", 0.012
    with StubServer(latency_ms=200) as stub:
        cmd = cli_command(stub.url, root, "tracking=none", *PRICES, f"calls.sweep_max_cost_usd={budget}",
                          "calls.cache=false", data=data)
        proc = run_cli([*cmd[:3], "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *cmd[3:], "seed=0,1"],
                       check=False, timeout=300)
        sent = stub.stats()["total_received"]
    assert proc.returncode == 4, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout + proc.stderr
    jobs = job_dirs(root)
    assert len(jobs) == 2
    metrics = [metrics_json(job)["metrics"] for job in jobs]
    (sweep_ledger,) = [json.loads(p.read_text()) for p in (root / "multirun").rglob("budget.json")]
    paid = sum(m["cost/usd"] for m in metrics)
    assert all(m["calls/requests"] > 0 for m in metrics)  # both jobs spent from it
    assert sent == sum(m["calls/requests"] for m in metrics)
    assert sweep_ledger["spent"] == pytest.approx(paid) and paid <= budget
    assert sum(m["budget/instances_not_run"] for m in metrics) > 0
    assert all(m["budget/sweep/max_usd"] == budget for m in metrics)
    assert len(budget_lines(proc.stderr)) >= 1 and "calls.sweep_max_cost_usd" in budget_lines(proc.stderr)[0]


def test_a_budget_with_an_unpriced_model_is_refused_before_any_request(tmp_path: Path) -> None:
    with InProcessModel() as stub:
        proc = run_job(cli_command(stub, tmp_path / "out", "tracking=none", "calls.max_cost_usd=1",
                                   "data.limit=1", cache_dir=tmp_path / "cache"), check=False)
        assert stub.stats()["total_received"] == 0
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "calls.max_cost_usd" in line]
    assert errors == ["cupid_exp: calls.max_cost_usd=1 needs a price for model 'openai_compatible' (inproc/stub): "
                      "litellm's price map does not list it; set its model_info.input_cost_per_token and "
                      "model_info.output_cost_per_token"]


@pytest.mark.parametrize("budget,verdict", [(10, "fits"), (0.001, "does NOT fit")])
def test_the_dry_run_says_whether_the_estimate_fits_the_budget(tmp_path: Path, budget: float, verdict: str) -> None:
    with InProcessModel() as stub:
        proc = run_job(cli_command(stub, tmp_path / "out", "calls.dry_run=true", *PRICES, "data.limit=2",
                                   f"calls.max_cost_usd={budget}", cache_dir=tmp_path / "cache"))
        assert stub.stats()["total_received"] == 0
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("budget:")]
    assert f" {verdict} calls.max_cost_usd=${budget:.4f}" in line


def test_a_jobs_worker_processes_draw_on_one_budget(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    root, budget = tmp_path / "out", 0.005
    with StubServer(latency_ms=50) as stub:
        proc = run_cli(cli_command(stub.url, root, "tracking=none", *PRICES, "runtime.workers=2",
                                   f"calls.max_cost_usd={budget}", data=data, cache_dir=tmp_path / "cache"),
                       check=False)
        sent = stub.stats()["total_received"]
    assert proc.returncode == 4, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert "model calls shared by 2 processes" in proc.stdout + proc.stderr
    (job,) = job_dirs(root)
    m = metrics_json(job)["metrics"]
    (state,) = ledgers(root)
    assert sent == m["calls/requests"] and state["spent"] == pytest.approx(m["cost/usd"]) and state["spent"] <= budget
    assert m["budget/instances_not_run"] > 0 and len(budget_lines(proc.stderr)) == 1
