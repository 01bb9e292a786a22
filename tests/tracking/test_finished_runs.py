"""A job's MLflow run, once it holds the job's results, is never re-parented or rewritten by a later sweep or command
that finds the job done: the sweep links to it (a small child run), its leaderboard includes it, and the run's
parent, times, tags and curves stay those of the attempt that published them."""

from __future__ import annotations

import sys
from pathlib import Path

from helpers.cli_runner import run_job
from helpers.tracking_runs import history, job_command, job_runs, store_uri
from mlflow.tracking import MlflowClient

from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.inprocess import InProcessModel
from cupid_exp.tracking.reopen import LINK_KIND, LINKS_TO


def _snapshot(client: MlflowClient, run_id: str) -> dict:
    run = client.get_run(run_id)
    return {"status": run.info.status, "start": run.info.start_time, "end": run.info.end_time,
            "tags": dict(run.data.tags), "params": dict(run.data.params),
            "curves": {key: history(client, run_id, key) for key in sorted(run.data.metrics)}}


def test_a_sweep_over_a_finished_job_links_to_its_run_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", 3)
    root = tmp_path / "out"
    uri = store_uri(root)
    client = MlflowClient(uri)
    with InProcessModel() as stub:
        single = job_command(stub, root, data, "model.name=stub_a")
        run_job(single, timeout=240)
        (first,) = job_runs(uri)
        before = _snapshot(client, first.info.run_id)
        assert before["status"] == "FINISHED" and "mlflow.parentRunId" not in before["tags"]
        sent = stub.stats()["total_received"]
        # a sweep whose first job is that one (done: nothing to run), and one more
        sweep = [sys.executable, "-m", "cupid_exp", "-m", *job_command(stub, root, data)[3:],
                 "model.name=stub_a,stub_b"]
        swept = run_job(sweep, timeout=300)
        assert f"this job finished earlier, in MLflow run {first.info.run_id} (FINISHED): left as it was" in (
            swept.stdout + swept.stderr)
        sent = stub.stats()["total_received"]
        again = run_job(single, timeout=240)  # the same command once more: done, nothing to write either
        assert stub.stats()["total_received"] == sent and "left as it was" in again.stdout + again.stderr

    assert _snapshot(client, first.info.run_id) == before  # parent, times, tags, params and every curve
    runs = client.search_runs([first.info.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("cupid.kind") == "sweep"]
    (link,) = [r for r in runs if r.data.tags.get("cupid.kind") == LINK_KIND]
    assert link.data.tags[LINKS_TO] == first.info.run_id and link.info.status == "FINISHED"
    assert link.data.tags["mlflow.parentRunId"] == parent.info.run_id
    # the runs list says which is which: the link says it is one, and to which run; the parent what the sweep varied
    assert link.info.run_name.startswith(f"link → {first.info.run_id[:8]} · stub_a · inference · standard")
    assert " | " not in link.info.run_name  # no results of its own
    assert parent.data.params["sweep.model.name"] == "stub_a,stub_b"
    assert parent.info.run_name.endswith(" · model.name=stub_a,stub_b")
    jobs = {r.data.params["model.name"]: r for r in job_runs(uri)}
    assert sorted(jobs) == ["stub_a", "stub_b"] and jobs["stub_a"].info.run_id == first.info.run_id
    assert jobs["stub_b"].data.tags["mlflow.parentRunId"] == parent.info.run_id
    # the sweep's leaderboard has both of its jobs: the one it ran, and the one it linked to
    assert parent.data.metrics["sweep/jobs"] == 2 and parent.data.metrics["sweep/jobs_in_tables"] == 2
