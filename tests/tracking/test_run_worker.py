"""The job's MLflow run (its opening, traces, progress and end) is kept by a worker process beside the job, and
the job's process never imports MLflow; a worker that dies or cannot start never costs the job its results or
its run."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from conftest import compose_config
from helpers.cli_runner import job_dirs, read_jsonl
from helpers.tracking_runs import held_job, job_command, only_run, store_uri, traces_of, wait_for
from mlflow.tracking import MlflowClient

from cupid_exp.data.loading import SAMPLE_FULL_PATH
from cupid_exp.evaluation import plan
from cupid_exp.job import connect, execute, publish, start_tracking, summarize_job
from cupid_exp.testing.cupid_data import stub_overrides, write_dataset
from cupid_exp.testing.stub_llm_server import StubServer
from cupid_exp.tracking import run_worker
from cupid_exp.tracking.live import LiveRun

N = 8
PNG_END = b"IEND\xaeB`\x82"  # a PNG file's last chunk


def _in_process_job(url: str, root: Path, *, limit: int = 4, parent: str | None = None, folder: str = "job"):
    """A traced job, phase by phase in this process, as ``run_job`` runs it; returns its run's keeper.
    ``parent``: the job is one of a sweep's (its parent run)."""
    cfg = compose_config([*stub_overrides(url), f"paths.output_root={root}", "runtime.progress=false",
                          f"tracking.uri={store_uri(root)}", "data=local", f"data.path={SAMPLE_FULL_PATH}",
                          f"data.limit={limit}"])
    job = plan(cfg, root / folder, None, parent, clients=False)
    live = start_tracking(job)
    connect(job)
    live.wait_opened()
    execution = execute(job, live)
    live.executed()
    publish(job, summarize_job(job, execution, 0.0), live)
    return live


def test_the_run_is_kept_by_another_process(tmp_path: Path) -> None:
    with StubServer() as stub:
        live = _in_process_job(stub.url, tmp_path)
    assert isinstance(live, run_worker.RunWorker) and live.process.pid != os.getpid()
    assert live.process.exitcode == 0 and live.claim.lock is None  # it said it was done, then exited
    uri = store_uri(tmp_path)
    run = only_run(uri)
    assert run.info.run_id == live.run_id and run.info.status == "FINISHED" and len(traces_of(uri, run)) == 4
    assert run.data.metrics["inference/f1"] > 0 and run.data.tags["cupid.complete"] == "true"


def _sweep_parent(root: Path) -> str:
    from cupid_exp.tracking.mlflow import experiment_id, prepare_store

    cfg = compose_config([f"tracking.uri={store_uri(root)}"])
    prepare_store(cfg.tracking.uri)
    return MlflowClient(cfg.tracking.uri).create_run(experiment_id(cfg.tracking), run_name="sweep").info.run_id


def test_a_sweeps_jobs_share_one_worker(tmp_path: Path) -> None:
    """The worker a finished job of a sweep leaves is the next job's (MLflow already imported there); each job's
    run is whole (its parent, results, traces); the last worker quits when asked (at this process's exit)."""
    parent = _sweep_parent(tmp_path)
    try:
        with StubServer() as stub:
            first = _in_process_job(stub.url, tmp_path, limit=3, parent=parent, folder="job1")
            assert first.process.exitcode is None and run_worker._IDLE is first  # waiting for the next job
            pid, first_run = first.process.pid, first.run_id
            second = _in_process_job(stub.url, tmp_path, limit=4, parent=parent, folder="job2")
        assert isinstance(second, run_worker.RunWorker) and second.process.pid == pid and second.run_id != first_run
    finally:
        run_worker.quit_idle()
    assert run_worker._IDLE is None and second.process.exitcode == 0
    uri = store_uri(tmp_path)
    client = MlflowClient(uri)
    runs = {r.info.run_id: r for r in client.search_runs([client.get_run(parent).info.experiment_id],
                                                         filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")}
    assert set(runs) == {first_run, second.run_id}
    for run_id, n in ((first_run, 3), (second.run_id, 4)):
        run = runs[run_id]
        assert run.info.status == "FINISHED" and run.data.tags["cupid.complete"] == "true"
        assert run.data.metrics["instances/total"] == n and len(traces_of(uri, run)) == n
        assert len(client.list_artifacts(run_id, "plots")) == 3


def test_a_sweeps_job_whose_kept_worker_died_starts_another(tmp_path: Path) -> None:
    parent = _sweep_parent(tmp_path)
    try:
        with StubServer() as stub:
            first = _in_process_job(stub.url, tmp_path, limit=2, parent=parent, folder="job1")
            first.process.kill()
            first.process.join(10)
            second = _in_process_job(stub.url, tmp_path, limit=3, parent=parent, folder="job2")
        assert second.process.pid != first.process.pid
        assert MlflowClient(store_uri(tmp_path)).get_run(second.run_id).info.status == "FINISHED"
    finally:
        run_worker.quit_idle()


def test_the_worker_draws_the_plots_when_the_model_phase_ends(tmp_path: Path) -> None:
    """Drawn while the job summarises (before it has published anything), then logged as they are."""
    with StubServer() as stub:
        cfg = compose_config([*stub_overrides(stub.url), f"paths.output_root={tmp_path}", "runtime.progress=false",
                              f"tracking.uri={store_uri(tmp_path)}", "data=local", f"data.path={SAMPLE_FULL_PATH}",
                              "data.limit=4"])
        job = plan(cfg, tmp_path / "job", clients=False)
        live = start_tracking(job)
        connect(job)
        live.wait_opened()
        execution = execute(job, live)
        live.executed()
        folder = tmp_path / "job" / "plots"
        def complete() -> list[Path]:  # three PNG files written to their end
            files = sorted(folder.glob("*.png"))
            return files if len(files) == 3 and all(p.read_bytes().endswith(PNG_END) for p in files) else []

        drawn = wait_for(complete, 60, "the worker drew no plots after the model phase")
        assert not (tmp_path / "job" / "metrics.json").exists()  # nothing published yet
        stamps = {p.name: p.stat().st_mtime_ns for p in drawn}
        publish(job, summarize_job(job, execution, 0.0), live)
    assert {p.name: p.stat().st_mtime_ns for p in folder.glob("*.png")} == stamps  # not drawn again
    run = only_run(store_uri(tmp_path))
    logged = MlflowClient(store_uri(tmp_path)).list_artifacts(run.info.run_id, "plots")
    assert sorted(Path(a.path).name for a in logged) == sorted(stamps)


def _run_with_import_probe(argv: list[str], timeout: float):
    """The CLI with ``argv`` in a fresh Python that prints, at its very end, which of MLflow and matplotlib it
    imported ("IMPORTED: [...]")."""
    import subprocess
    import sys
    import textwrap

    from helpers.cli_runner import cli_env

    script = textwrap.dedent(f"""
        import sys, atexit
        sys.argv = {["cupid_exp", *argv]!r}
        atexit.register(lambda: print("IMPORTED:", [m for m in ("mlflow", "matplotlib") if m in sys.modules]))
        from cupid_exp.cli import main
        main()
    """)
    return subprocess.run([sys.executable, "-c", script], env=cli_env(), capture_output=True, text=True,
                          timeout=timeout)


def test_the_job_process_never_imports_mlflow_or_matplotlib(tmp_path: Path) -> None:
    """The job's own process: no `import mlflow` (1-2 s of its start-up), all of it in the worker; nor matplotlib
    (the worker draws the run's plots, into the job's folder and the run)."""
    data = write_dataset(tmp_path / "data.jsonl", 3)
    with StubServer() as stub:
        proc = _run_with_import_probe(job_command(stub.url, tmp_path / "out", data)[3:], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "IMPORTED: []" in proc.stdout, proc.stdout[-2000:]
    run = only_run(store_uri(tmp_path / "out"))
    assert run.info.status == "FINISHED"
    drawn = sorted(p.name for p in (tmp_path / "out" / "runs").rglob("plots/*.png"))  # the job folder
    assert drawn == ["inference_by_history_length.png", "inference_by_position.png", "inference_by_type.png"]
    logged = MlflowClient(store_uri(tmp_path / "out")).list_artifacts(run.info.run_id, "plots")
    assert sorted(Path(a.path).name for a in logged) == drawn


def test_a_sweeps_launching_process_never_imports_mlflow_or_matplotlib(tmp_path: Path) -> None:
    """The sweep's parent run is opened, and its leaderboard and plots logged, by the run worker its jobs share:
    the process that runs the sweep imports neither MLflow (1-3 s before its first job could start) nor
    matplotlib (the leaderboard's plots)."""
    data = write_dataset(tmp_path / "data.jsonl", 3)
    root = tmp_path / "out"
    with StubServer() as stub:
        proc = _run_with_import_probe(["-m", *job_command(stub.url, root, data, "model.name=stub_a,stub_b")[3:]],
                                      timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "IMPORTED: []" in proc.stdout, proc.stdout[-2000:]
    client = MlflowClient(store_uri(root))
    runs = client.search_runs([client.get_experiment_by_name("cupid").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("cupid.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("cupid.kind") == "job"]
    assert parent.info.status == "FINISHED" and parent.data.metrics["sweep/jobs"] == 2
    assert sorted(c.data.params["model.name"] for c in children) == ["stub_a", "stub_b"]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert all(c.info.status == "FINISHED" for c in children)
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"leaderboard.md", "plots"}


def test_without_a_worker_the_job_keeps_its_run_itself(tmp_path: Path, monkeypatch, caplog) -> None:
    def no_spawn(*args) -> None:
        raise OSError("no processes left")

    monkeypatch.setattr(run_worker, "RunWorker", no_spawn)
    with StubServer() as stub, caplog.at_level(logging.WARNING):
        live = _in_process_job(stub.url, tmp_path)
    assert isinstance(live, LiveRun)
    assert "no worker (OSError: no processes left)" in caplog.text
    uri = store_uri(tmp_path)
    run = only_run(uri)
    assert run.info.status == "FINISHED" and len(traces_of(uri, run)) == 4


def _worker_of(pid: int) -> int:
    """The job's MLflow worker: its child process started by multiprocessing's spawn."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid and b"spawn_main" in cmdline:
            return int(entry)
    return 0


def test_a_worker_killed_mid_job_costs_the_traces_only(tmp_path: Path) -> None:
    """The job finishes its run itself: results, metrics, artifacts and status; no more traces or progress."""
    data = write_dataset(tmp_path / "data.jsonl", N)
    root, log = tmp_path / "out", tmp_path / "job.log"
    with StubServer() as stub, held_job(stub, job_command(stub.url, root, data, "model.max_concurrency=2"), log,
                                        after=3 * N + 2) as proc:  # some instances finished, not all
        worker = wait_for(lambda: _worker_of(proc.pid), 30, "the MLflow worker")
        os.kill(worker, signal.SIGKILL)
        stub.release()
        returncode = proc.wait(timeout=120)
    text = log.read_text()
    assert returncode == 0, text[-3000:]
    assert text.count("the MLflow worker stopped (the MLflow worker exited (code -9))") == 1, text[-3000:]
    run = only_run(store_uri(root))
    assert run.info.status == "FINISHED" and run.data.tags["cupid.complete"] == "true"
    assert run.data.metrics["calls/total"] == 4 * N and run.data.tags["cupid.attempt.1"].startswith("FINISHED")
    artifacts = {a.path for a in MlflowClient(store_uri(root)).list_artifacts(run.info.run_id)}
    assert {"instances.jsonl", "metrics.json", "instances_table.json", "plots"} <= artifacts
    (job,) = job_dirs(root)
    assert len(read_jsonl(job / "instances.jsonl")) == N
    assert len(traces_of(store_uri(root), run)) < N  # (those the worker exported before it was killed)


def test_a_dead_worker_is_reported_once_and_never_waited_for(caplog) -> None:
    worker = run_worker.RunWorker()
    worker.process.kill()
    worker.process.join(10)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            worker.instance_finished(object(), None, {}, None)  # never sent: the worker is gone
        worker.end("FAILED")  # no run was opened: nothing to end, and no wait
    assert caplog.text.count("the MLflow worker exited (code -9)") == 1


def test_a_store_that_refuses_the_run_stops_the_job_before_any_call(tmp_path: Path, monkeypatch) -> None:
    """The run is opened while the job builds its clients; a store error is the job's error before the
    first model call (the worker's message, one line), and the worker is gone."""
    import pytest

    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-for-the-key-check")  # the plan checks keys before the run

    from conftest import compose_config as compose

    root = tmp_path / "out"
    cfg = compose(["model=gpt4o", f"paths.output_root={root}", f"tracking.uri={store_uri(root)}",
                   "tracking.experiment=x", "data=local", f"data.path={SAMPLE_FULL_PATH}", "data.limit=1"])
    job = plan(cfg, root / "job", clients=False)
    # after the checks: the store breaks in between, into a database MLflow refuses that holds someone's rows (a file
    # of garbage would be set aside and made again: ``tracking.mlflow.repair``)
    import sqlite3
    from contextlib import closing

    (root / "mlflow.db").unlink(missing_ok=True)
    with closing(sqlite3.connect(root / "mlflow.db")) as con:
        con.execute("CREATE TABLE runs (name TEXT)")
        con.execute("INSERT INTO runs VALUES ('not mlflow')")
        con.commit()
    live = start_tracking(job)
    with pytest.raises(run_worker.TrackingError, match="could not be opened"):
        live.wait_opened()
    live.end("FAILED")
    assert live.process.exitcode is not None and live.claim.lock is None


def test_a_store_that_refuses_the_results_fails_the_run_and_keeps_the_files(tmp_path: Path) -> None:
    """The worker cannot log the results (here: the artifact folder turned into a file after the run opened):
    the job hears the store's error, the run ends FAILED (never RUNNING), the job's own files are written."""
    import shutil

    import pytest

    with StubServer() as stub:
        cfg = compose_config([*stub_overrides(stub.url), f"paths.output_root={tmp_path}", "runtime.progress=false",
                              f"tracking.uri={store_uri(tmp_path)}", "data=local", f"data.path={SAMPLE_FULL_PATH}",
                              "data.limit=1", "tracking.traces=false"])
        job = plan(cfg, tmp_path / "job", clients=False)
        live = start_tracking(job)
        connect(job)
        live.wait_opened()
        execution = execute(job, live)
        shutil.rmtree(tmp_path / "mlartifacts")
        (tmp_path / "mlartifacts").write_text("not a folder")
        with pytest.raises(run_worker.TrackingError, match="MLflow logging failed"):
            publish(job, summarize_job(job, execution, 0.0), live)
    assert only_run(store_uri(tmp_path)).info.status == "FAILED"
    assert (tmp_path / "job" / "instances.jsonl").exists() and live.claim.lock is None


def test_a_job_killed_half_way_through_a_message_leaves_no_worker_behind(tmp_path: Path) -> None:
    """SIGKILLed while its queue's feeder thread had sent a message's length but not the message: the worker
    reads an EOF (its own copy of the writing end is closed), not a read that waits forever."""
    import subprocess
    import sys
    import textwrap

    from helpers.cli_runner import cli_env

    script = textwrap.dedent("""
        import os, struct
        from cupid_exp.tracking import run_worker
        worker = run_worker.RunWorker()
        os.write(worker.pipes.inbox._writer.fileno(), struct.pack("!i", 4096))  # a length, then nothing
        print(worker.process.pid, flush=True)
        os._exit(0)  # as a SIGKILL would: no feeder, no clean-up
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=cli_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    worker = int(proc.stdout.split()[-1])
    wait_for(lambda: not Path(f"/proc/{worker}").exists() or "Z" in Path(f"/proc/{worker}/stat").read_text().split()[2],
             30, "the orphaned worker's exit")


def test_a_job_killed_before_the_workers_reply_leaves_it_exiting_quietly() -> None:
    """The job dies (kill -9) after its last message and before the worker's reply: the reply meets a closed pipe,
    and the worker, an orphan now, exits without a traceback (it shares the job's stderr: the console)."""
    import subprocess
    import sys
    import textwrap

    from helpers.cli_runner import cli_env

    script = textwrap.dedent("""
        import os
        from cupid_exp.tracking import run_worker
        worker = run_worker.RunWorker()
        worker.pipes.inbox.put(("end", "KILLED", None, {}, {}))  # answered ("finished") to nobody
        worker.pipes.inbox.close()
        worker.pipes.inbox.join_thread()  # in the pipe
        print(worker.process.pid, flush=True)
        os._exit(0)  # as a SIGKILL would: the reading end of the worker's notes goes with the process
    """)
    # the worker inherits the output pipes: this returns once the worker too has exited
    proc = subprocess.run([sys.executable, "-c", script], env=cli_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split(), proc.stderr[-2000:]
    worker = int(proc.stdout.split()[-1])
    assert not Path(f"/proc/{worker}").exists() or "Z" in Path(f"/proc/{worker}/stat").read_text().split()[2]
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr[-2000:]
