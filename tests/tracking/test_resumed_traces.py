"""A job run again keeps one trace per instance in its run, and a sweep run again leaves no empty parent run.

Two sweeps of one job, in this process: the first meets a provider failure on one instance; between them a
journal line is cut as a kill mid-write cuts it; the second sweep (a new folder, so a new parent) reruns both
instances in the job's reopened run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import compose_config
from helpers.cli_runner import seed_store
from helpers.tracking_runs import PRICES, only_run, store_uri, traces_of
from mlflow.tracking import MlflowClient

from cupid_exp.evaluation import run_evaluation
from cupid_exp.testing.cupid_data import stub_overrides, write_dataset
from cupid_exp.testing.stub_llm_server import StubServer
from cupid_exp.tracking import run_worker
from cupid_exp.tracking.mlflow import SweepParent, parent_run_id
from cupid_exp.tracking.sweep import SweepEnd

N = 5


def cut_a_journal_line(journal: Path, spare: str) -> str:
    """Leave the journal as a kill in the middle of writing one good record (not ``spare``'s) leaves it: that
    record last, cut in half. Returns its key."""
    lines = journal.read_bytes().splitlines(keepends=True)
    torn = next(line for line in reversed(lines) if json.loads(line)["key"] != spare)
    journal.write_bytes(b"".join(line for line in lines if line is not torn) + torn[: len(torn) // 2])
    return json.loads(torn)["key"]


def sweep(cfg, root: Path, folder: str) -> str:
    """The job as a sweep of one, ended as the sweep's end ends it; the parent run's id."""
    sweep_dir = root / "multirun" / folder
    run_evaluation(cfg, sweep_dir / "0_job", None, SweepParent(str(sweep_dir)))
    worker = run_worker.take_idle()
    assert worker is not None and worker.close_sweep(SweepEnd(cfg.tracking.uri, "cupid", str(sweep_dir), 0,
                                                              failed=False))[0]
    return parent_run_id(sweep_dir)


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("resumed")
    data = write_dataset(tmp / "data.jsonl", N)
    root = tmp / "out"
    seed_store(root)
    uri = store_uri(root)
    with StubServer(giveup_match="(variant 2)") as stub:
        cfg = compose_config([*stub_overrides(stub.url), f"paths.output_root={root}", "runtime.progress=false",
                              "data=local", f"data.path={data}", f"calls.cache_dir={root / 'cache'}",
                              "calls.num_retries=0", "runtime.max_failed_fraction=1", *PRICES])
        first = sweep(cfg, root, "first")
        (journal,) = (root / "journal").glob("*.jsonl")
        records = [json.loads(line) for line in journal.read_text().splitlines()]
        (failed,) = [r["key"] for r in records if r["errors"]]
        before = sorted(t.info.tags["cupid.key"] for t in traces_of(uri, only_run(uri)))
        torn = cut_a_journal_line(journal, spare=failed)
        stub.reconfigure(giveup_match=None)
        second = sweep(cfg, root, "second")
    return {"uri": uri, "first": first, "second": second, "failed": failed, "torn": torn, "before": before,
            "keys": sorted(r["key"] for r in records)}


def test_an_instance_run_again_replaces_its_earlier_trace(resumed) -> None:
    uri = resumed["uri"]
    assert resumed["before"] == resumed["keys"]  # the first attempt traced each instance, the failed one too
    run = only_run(uri)
    assert run.data.tags["cupid.attempt"] == "2"
    traces = {}
    for trace in traces_of(uri, run):
        traces.setdefault(trace.info.tags["cupid.key"], []).append(trace)
    assert sorted(traces) == resumed["keys"] and all(len(found) == 1 for found in traces.values())
    attempts = {key: found[0].info.tags["cupid.attempt"] for key, found in traces.items()}
    rerun = {resumed["failed"], resumed["torn"]}
    assert attempts == {key: "2" if key in rerun else "1" for key in resumed["keys"]}  # the journalled one stays
    assert traces[resumed["failed"]][0].info.state == "OK"


def test_a_sweep_run_again_leaves_no_empty_parent_run(resumed) -> None:
    client = MlflowClient(resumed["uri"])
    run = only_run(resumed["uri"])
    assert run.data.tags["mlflow.parentRunId"] == resumed["second"] != resumed["first"]
    experiment = run.info.experiment_id
    parents = [r.info.run_id for r in client.search_runs([experiment], "tags.`cupid.kind` = 'sweep'")]
    assert parents == [resumed["second"]]
    earlier = client.get_run(resumed["first"])  # deleted as MLflow deletes a run: out of view, restorable
    assert earlier.info.lifecycle_stage == "deleted" and earlier.info.status == "FINISHED"
