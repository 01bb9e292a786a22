"""End to end: the real CLI against the stub model server on 127.0.0.1, into a real SQLite MLflow store; the same
command run in this process against the in-process model (``run_job``) where neither the wire nor the process matters.

(The embedded local model's own smoke runs are in tests/test_local_demo.py.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.cli_runner import PROJECT_ROOT, cli_command, cli_env, job_dirs, read_jsonl, run_cli, run_job
from helpers.processes import alive, children, with_default_sigint
from mlflow.tracking import MlflowClient

from cupid_exp.testing.cupid_data import stub_overrides, write_dataset
from cupid_exp.testing.inprocess import InProcessModel
from cupid_exp.testing.stub_llm_server import StubServer


@pytest.fixture(scope="module")
def stub():
    with StubServer() as server:
        yield server


@pytest.fixture(scope="module")
def inproc():
    with InProcessModel() as model:
        yield model


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
    # the printed table is kept beside metrics.json, and in the job's log
    printed = (job / "results.txt").read_text().strip()
    assert printed.startswith("CUPID inference |") and printed.endswith("complete: 2 of 2 instances ran without "
                                                                        "a failed step")
    assert printed in proc.stdout and printed.splitlines()[2] in (job / "cli.log").read_text()

    client, found = runs(root)
    (run,) = found
    assert run.data.params["model.name"] == "openai_compatible" and run.data.params["choice.setting"] == "standard"
    assert run.data.metrics["inference/count/instances"] == 2 and run.data.metrics["calls/infer"] == 2
    assert {"git_commit", "git_dirty", "dataset_digest", "prompts_digest", "cupid.complete"} <= set(run.data.tags)
    assert run.info.status == "FINISHED" and run.data.tags["cupid.complete"] == "true"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    expected = {"config.yaml", "instances.jsonl", "metrics.json", "results.txt", "instances_table.json", "plots"}
    assert expected <= artifacts

    # an identical rerun finds every instance in the resume journal and calls nothing
    # (the reruns in this process: what they show needs neither a process of their own nor a new Python)
    resumed = run_job(cli_command(stub.url, root, "data.limit=2", cache_dir=cache))
    assert "calls: 0 ok (0 cached)" in resumed.stdout
    assert job_dirs(root) == [job]  # into the folder of the first run (test_a_rerun_reuses_its_experiments_folder)
    assert json.loads((job / "metrics.json").read_text())["metrics"]["resume/instances_from_journal"] == 2
    # without the journal, the same calls are served from the response cache
    again = run_job(cli_command(stub.url, root, "data.limit=2", "runtime.resume=false", cache_dir=cache))
    assert "calls: 8 ok (8 cached), 0 failed; requests sent: 0" in again.stdout


def test_a_rerun_reuses_its_experiments_folder(tmp_path: Path, inproc) -> None:
    """A rerun of a finished job, answered from its journal, writes into the folder of its first run, as a sweep's job
    too (the sweep's folder keeps its status, naming that folder); a changed override is a folder of its own."""
    root = tmp_path / "outputs"
    base = cli_command(inproc, root, "tracking=none")
    run_job([*base, "data.limit=1"])
    (job,) = job_dirs(root)
    inproc.reset()
    sweep = run_job([*base[:3], "-m", *base[3:], "data.limit=1"])
    assert inproc.stats()["total_received"] == 0 and "requests sent: 0" in sweep.stdout  # the journal answered
    assert job_dirs(root) == [job]
    metrics = json.loads((job / "metrics.json").read_text())["metrics"]
    assert metrics["resume/instances_from_journal"] == 1 and len(read_jsonl(job / "instances.jsonl")) == 1
    assert "data.limit=1" in (job / ".hydra" / "overrides.yaml").read_text()
    (status,) = [json.loads(p.read_text()) for p in (root / "multirun").glob("*/*/*/job_status.json")]
    assert status["folder"] == str(job) and status["outcome"] == "ok"

    run_job([*base, "data.limit=2"])  # another experiment
    assert len(job_dirs(root)) == 2 and job in job_dirs(root)
    (other,) = [d for d in job_dirs(root) if d != job]
    assert len(read_jsonl(other / "instances.jsonl")) == 2 and len(read_jsonl(job / "instances.jsonl")) == 1


def test_settings_sweep_and_oracle_preference_each_log_a_run(tmp_path: Path, inproc) -> None:
    root = tmp_path / "outputs"
    cmd = cli_command(inproc, root, "data.limit=1")
    run_job([*cmd[:3], "-m", *cmd[3:], "task=both", "setting=standard,oracle,summary"])
    run_job(cli_command(inproc, root, "data.limit=1", "task=generation", "setting=oracle_preference"))
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
    proc = run_job([sys.executable, "-m", "cupid_exp", "task=inference", "setting=oracle_preference",
                    f"paths.output_root={tmp_path / 'outputs'}"], check=False)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("cupid_exp:")]
    assert len(lines) == 1 and "setting=oracle_preference is defined for generation only" in lines[0]
    assert not (tmp_path / "outputs" / "mlflow.db").exists()
    (log,) = (tmp_path / "outputs" / "runs").glob("*/*/cli.log")  # the folder the refusal left says why
    assert lines[0] in log.read_text()


def test_a_dry_run_keeps_its_estimate_and_writes_no_placeholder_scores(tmp_path: Path, inproc) -> None:
    root = tmp_path / "outputs"
    proc = run_job(cli_command(inproc, root, "data.limit=2", "task=both", "calls.dry_run=true"))
    (job,) = [p.parent for p in root.glob("runs/*/*/metrics.json")]
    saved = json.loads((job / "metrics.json").read_text())
    assert saved["dry_run"] and saved["metrics"]["calls/total"] == 12 and saved["metrics"]["tokens/prompt"] > 0
    scores = [k for k in saved["metrics"] if k.startswith(("inference/", "generation/"))]
    assert not scores and saved["breakdown"] == {} and not (job / "instances.jsonl").exists()
    estimate = (job / "results.txt").read_text().strip()
    assert estimate.startswith("DRY RUN (no model was called)") and estimate in proc.stdout
    assert "total: 12 calls" in (job / "cli.log").read_text()


def test_prefmatcher_evaluator_serves_and_scores(tmp_path: Path, stub) -> None:
    """evaluator=prefmatcher with the runner starting its model server: a second stub server stands in for
    vLLM (which needs a GPU and the Hub); the decomposer and judge are the first stub (no key here)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # subject, decomposer, judge at the stub; its evaluator=local would win over evaluator=prefmatcher
    overrides = [o for o in stub_overrides(stub.url) if "matcher" not in o and not o.startswith("evaluator=")]
    proc = run_job([sys.executable, "-m", "cupid_exp", "evaluator=prefmatcher", *overrides,
                    "evaluator.server.serve=true", f"evaluator.server.base_url=http://127.0.0.1:{port}",
                    f"evaluator.server.command=[{sys.executable},-m,cupid_exp.testing.stub_llm_server,--port,{port}]",
                    f"evaluator.matcher.api_base=http://127.0.0.1:{port}/v1", "data.limit=1",
                    f"paths.output_root={tmp_path / 'outputs'}", "runtime.progress=false"])
    assert "evaluator=prefmatcher" in proc.stdout
    _, (run,) = runs(tmp_path / "outputs")
    assert run.data.metrics["inference/count/scored"] == 1 and run.data.metrics["calls/match_recall"] == 1
    record = read_jsonl(next((tmp_path / "outputs" / "runs").glob("*/*/instances.jsonl")))[0]
    assert record["raw"]["match_recall"] and not record["errors"]
    assert run.data.params["evaluator.matcher_prompt"] == "evaluation/preference_matcher_model"


def test_retrieval_sweep_beside_standard_and_oracle(tmp_path: Path, inproc) -> None:
    root = tmp_path / "outputs"
    cmd = cli_command(inproc, root, "data.limit=2")
    base = [*cmd[:3], "-m", *cmd[3:]]
    run_job([*base, "setting=standard,oracle"])
    run_job([*base, "setting=retrieval", "setting.retriever=bm25,recency"])
    run_job([*base, "setting=standard,oracle", "tracking.run_name=again"])  # same identity: replayed
    _, found = runs(root)
    jobs = [r for r in found if r.data.tags.get("cupid.kind") == "job"]
    assert len(jobs) == 4  # the replay found the standard and oracle jobs done (one run per job)
    retrieval = {r.data.params["setting.retriever"]: r for r in jobs if r.data.params["setting.name"] == "retrieval"}
    assert sorted(retrieval) == ["bm25", "recency"]
    assert sorted(r.info.run_name.split(" · ")[:3] for r in retrieval.values()) == [  # a name per variant
        ["openai_compatible", "inference", "retrieval[bm25,k=2]"],
        ["openai_compatible", "inference", "retrieval[recency,k=2]"]]
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


def _interrupt_once_journaled(cmd: list[str], journal_dir: Path, at_least: int
                              ) -> tuple[subprocess.CompletedProcess, list[int]]:
    """Start the CLI in its own process group and press Ctrl-C (SIGINT to the group, as a terminal does) once the
    journal holds ``at_least`` instances; returns how the process ended and the children it had."""
    proc = subprocess.Popen(with_default_sigint(cmd), cwd=PROJECT_ROOT, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        journals = list(journal_dir.glob("*.jsonl"))
        if journals and len(journals[0].read_text().splitlines()) >= at_least:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the job ended before it could be interrupted"
    kids = children(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), kids


def _gone(pids: list[int], within_s: float = 10.0) -> bool:
    """Whether every process in ``pids`` has ended within a few seconds (multiprocessing's resource tracker ends
    once it reads its parent's end)."""
    deadline = time.monotonic() + within_s
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _journaled(journal_dir: Path) -> int:
    (journal,) = journal_dir.glob("*.jsonl")
    return len({r["key"] for r in read_jsonl(journal)})


@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_ctrl_c_prints_one_line_and_exits_130_and_the_same_command_resumes(tmp_path: Path, sweep: bool) -> None:
    data = write_dataset(tmp_path / "data.jsonl", 8)
    root = tmp_path / "out"
    with StubServer(latency_ms=400) as stub:
        cmd = cli_command(stub.url, root, "model.max_concurrency=2", data=data)
        if sweep:  # two jobs; the first is interrupted, the second never starts
            cmd = [*cmd[:3], "-m", *cmd[3:], "runtime.failure_policy=exclude,zero"]
        proc, kids = _interrupt_once_journaled(cmd, root / "journal", at_least=2)
        finished = _journaled(root / "journal")
        assert proc.returncode == 130, proc.stderr[-3000:]
        assert kids and _gone(kids)  # its workers (the MLflow run's) are gone with it
        where = " in sweep job 0_openai_compatible_inference_standard_local" if sweep else ""
        assert proc.stderr.strip().splitlines() == [
            f"interrupted{where}: {finished} of 8 instances finished and journaled; run the same command to resume"
        ], proc.stderr[-3000:]
        assert 2 <= finished < 8
        assert len(list((root / "runs").glob("*/*/.hydra"))) == 1  # the sweep stopped there (its jobs' folders)
        if not sweep:  # the same command resumes: what the line counted is not run again
            stub.config.wire.latency_ms = 0
            resumed = run_job(cmd)
            assert f"resuming: {finished} of 8 instances already finished" in resumed.stdout + resumed.stderr


def test_a_model_name_with_a_path_in_it_stays_inside_the_output_root(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "out"
    escape = "../" * 5 + "escaped"  # from <root>/runs/<name>/<fingerprint>: out of <root>, into tmp_path
    for sweep in ([], ["-m"]):
        run_job([sys.executable, "-m", "cupid_exp", *sweep, f"model.name={escape}", "calls.dry_run=true",
                 "tracking=none", f"paths.output_root={root}", "runtime.progress=false"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep"] and os.listdir(root.parent) == ["out"]
    (config,) = root.rglob(".hydra/config.yaml")  # the run's and the sweep job's (one experiment: one folder)
    named = config.parent.parent.parent.name  # the folder holding the experiments of a model, task, setting
    assert "escaped" in named and ".._.._" in named
    (status,) = root.rglob("job_status.json")  # the sweep's folder names its job after the sanitised name too
    assert ".._.._" in status.parent.name and status.parent.parent.parent.parent == root / "multirun"


def test_a_job_whose_output_is_no_terminal_prints_progress_lines(tmp_path: Path) -> None:
    """nohup, SLURM, CI: no bars, but a line every runtime.progress_every_s seconds (tests run with progress off)."""
    with InProcessModel(latency_ms=400, name="slow") as slow:  # beside the module's ``inproc`` (named "stub")
        cmd = [a for a in cli_command(slow, tmp_path / "outputs", "data.limit=2", "tracking=none")
               if a != "runtime.progress=false"]
        proc = run_job([*cmd, "runtime.progress_every_s=0.3"])
    lines = [line for line in proc.stderr.splitlines() if line.startswith("progress: ")]
    assert len(lines) >= 2, proc.stderr[-2000:]
    assert all(re.match(r"progress: \d/2 instances \(\d+%\); calls \d+ \(\d+ cached, 0 failed\); \$0\.0000; "
                        r"\d+\.\d instances/min; 0m0\ds elapsed", line) for line in lines), lines
    assert lines[-1].startswith("progress: 2/2 instances (100%); calls 8 (0 cached, 0 failed)")


def test_a_setting_the_chosen_option_does_not_read_is_refused_in_one_line(tmp_path: Path) -> None:
    """data.path beside data=sample ran the sample and logged the path it never read; model.local.* beside an API
    model was a traceback: each is one line naming the option that reads it, exit 2, nothing run."""
    cmd = [sys.executable, "-m", "cupid_exp", f"paths.output_root={tmp_path}"]
    proc = run_job([*cmd, "data.path=/nonexistent/x.jsonl"], check=False)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["cupid_exp: data.path is read only by data=local; add data=local"]
    assert not (tmp_path / "mlflow.db").exists()
    (folder,) = (tmp_path / "runs").glob("*/*")
    assert sorted(p.name for p in folder.iterdir()) == [".hydra", "cli.log"]  # no journal, no instances
    assert "/nonexistent" not in (folder / "cli.log").read_text().replace("data.path is read only", "")
    proc = run_job([*cmd, "model=gpt4o", "model.local.n_threads=4"], check=False)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "cupid_exp: model.local.n_threads is read only by model=local, model=local_gemma; add model=local"]


def test_a_misspelt_key_is_one_line_of_ours_and_help_lists_only_choices(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "cupid_exp", f"paths.output_root={tmp_path}"]
    proc = run_job([*cmd, "data.limt=1"], check=False)
    assert proc.returncode == 2 and not (tmp_path / "runs").exists()
    assert proc.stderr.splitlines() == [  # Hydra's own text was 8 lines
        "cupid_exp: Could not override 'data.limt': Key 'limt' not in 'DataConfig' (a new key: +data.limt=1); "
        "HYDRA_FULL_ERROR=1 shows Hydra's full message"]
    (line,) = run_job([*cmd, "model=gpt5"], check=False).stderr.splitlines()
    assert "Could not find 'model/gpt5' (choose one of: claude, " in line
    full = run_job([*cmd, "data.limt=1"], env={"HYDRA_FULL_ERROR": "1"}, check=False)
    assert full.returncode == 2 and "Traceback" in full.stderr and "Could not override 'data.limt'" in full.stderr
    shown = run_job([*cmd, "--help"]).stdout
    assert "setting: oracle, oracle_preference, retrieval, standard, summary\n" in shown and "_schema" not in shown


def test_a_sweep_whose_job_does_not_compose_stops_in_one_line_before_anything_is_made(tmp_path: Path) -> None:
    """Every job of a sweep is composed before its MLflow store, parent run or folder is made: Hydra composes them
    only after its callbacks start, and a typo in one job left a half-made store and Hydra's lines."""
    cmd = [sys.executable, "-m", "cupid_exp", "-m", f"paths.output_root={tmp_path}", "task=inference,generation"]
    proc = run_job([*cmd, "setting=retrieval,standard", "setting.top_k=3"], check=False)  # only standard's fail
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "cupid_exp: Could not override 'setting.top_k': Key 'top_k' not in 'StandardConfig' (a new key: "
        "+setting.top_k=3); HYDRA_FULL_ERROR=1 shows Hydra's full message"], proc.stderr
    proc = run_job([*cmd, "model=gpt4o,gpt5"], check=False)
    (line,) = proc.stderr.splitlines()
    assert proc.returncode == 2 and line.startswith("cupid_exp: In 'config': Could not find 'model/gpt5' (choose one")
    assert not list(tmp_path.iterdir())  # no store, no sweep folder, no multirun.yaml


_REFUSED_KEY = "sk-refusal-SENTINEL-0a1b2c3d"


@pytest.mark.parametrize("program, overrides, named", [
    ("cupid_exp", ["model.api_key=" + _REFUSED_KEY], "+model.api_key=***"),
    ("cupid_exp", ["-m", f"model.api_key={_REFUSED_KEY},sk-refusal-SENTINEL-4e5f6a7b"], "+model.api_key=***"),
    ("cupid_exp", ["model=" + _REFUSED_KEY], "Could not find 'model/***'"),
    ("cupid_exp", ["-m", "model=gpt4o," + _REFUSED_KEY], "Could not find 'model/***'"),
    ("cupid_exp.synthesize", ["synthesis=api", "llm@synthesis.roles.decomposer=" + _REFUSED_KEY],
     "Could not find 'llm/***'"),
], ids=["key-run", "key-sweep", "choice-run", "choice-sweep", "synthesis-choice"])
def test_a_refused_override_never_echoes_the_key_it_carries(tmp_path: Path, program: str, overrides: list[str],
                                                             named: str) -> None:
    """Hydra's refusal quotes the override back: a key under a key's name (``+model.api_key=…``) or given where a
    choice goes (``model=sk-…``: "Could not find 'model/sk-…'") is masked, in a single run (our one line) and in a
    sweep (our one line too, each job composed before the sweep starts)."""
    proc = run_job([sys.executable, "-m", program, *overrides, f"paths.output_root={tmp_path}"], check=False)
    assert proc.returncode == 2 and named in proc.stderr, proc.stderr  # refused, what was wrong still named
    assert "SENTINEL" not in proc.stdout + proc.stderr, proc.stderr
    saved = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert not [p for p in saved if "SENTINEL" in p.read_text(errors="replace")]
    assert not saved or "-m" not in overrides  # a sweep's jobs are composed before it writes anything
