"""The job's run spans the job: created before the first call, progress points while it works, ended with it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers.cli_runner import job_dirs, read_jsonl
from helpers.tracking_runs import history, job_command, job_runs, only_run, start, store_uri, wait_for
from mlflow.tracking import MlflowClient

from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.stub_llm_server import StubServer

N = 20
CALLS_PER_INSTANCE = 4  # infer, decompose, match precision, match recall


def test_the_run_streams_progress_while_the_job_works_and_has_the_dataset_as_input(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    root = tmp_path / "out"
    uri = store_uri(root)
    with StubServer(latency_ms=20) as stub:
        # freeze the job once more than 3 calls per instance are done: then at least one instance has finished
        # (and not all); the held requests are retried when the gate opens
        stub.hold_after(3 * N + 2)
        began = time.monotonic()
        proc = start(job_command(stub.url, root, data, "model.max_concurrency=2", "calls.num_retries=3"),
                     tmp_path / "job.log")
        try:
            assert stub.wait_held(timeout=120), (tmp_path / "job.log").read_text()[-3000:]
            client = MlflowClient(uri)

            def mid_point():  # the run already shows part of the job done while the job is stuck
                run = only_run(uri)
                done = dict(history(client, run.info.run_id, "progress/instances_done"))
                return run if done and 0 < max(done) < N else None

            run = wait_for(mid_point, 30, "a progress point mid-job")
            assert run.info.status == "RUNNING" and run.info.end_time is None
            # the job said which run to follow when it opened it, not only at its end
            assert f"MLflow run {run.info.run_id} opened at {uri}" in (tmp_path / "job.log").read_text()
            # its name says what it is: model, task, setting, evaluator, data
            assert run.info.run_name.startswith("openai_compatible · inference · standard · eval ")
            assert run.info.run_name.endswith(" · data.jsonl")
            assert run.data.params["data.name"] == "local" and run.data.tags["job_identity"]
            (dataset,) = [d.dataset for d in run.inputs.dataset_inputs]
        finally:
            stub.release()
        assert proc.wait(timeout=180) == 0, (tmp_path / "job.log").read_text()[-3000:]
        wall = time.monotonic() - began

    run = only_run(uri)
    run_id = run.info.run_id
    assert run.info.status == "FINISHED" and run.info.end_time > run.info.start_time
    # the run existed before the first model call: its start is before the model phase's end by the whole phase
    assert (run.info.end_time - run.info.start_time) / 1000 >= run.data.metrics["time/model_seconds"]

    done = history(client, run_id, "progress/instances_done")
    steps = [s for s, _ in done]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == N and all(s == v for s, v in done)
    assert len(done) >= 3  # start, mid-job, end
    calls = history(client, run_id, "progress/calls")
    assert [v for _, v in calls] == sorted(v for _, v in calls) and calls[-1][1] == N * CALLS_PER_INSTANCE
    # bounded: at most one point a second (plus start and end), far fewer than calls
    assert len(done) <= wall + 2 and len(done) < N * CALLS_PER_INSTANCE / 4
    f1 = history(client, run_id, "progress/inference/f1")
    assert f1 and f1[-1][0] == N and f1[-1][1] == pytest.approx(run.data.metrics["inference/f1"])
    cost = history(client, run_id, "progress/cost_usd")
    assert cost[-1][1] == run.data.metrics["cost/usd"] > 0
    # the runs list shows how it scored: the headline, cost and units done after its name, and as its description
    final = run.data.metrics
    glance = f"inference f1 {final['inference/f1']:.3f} · ${final['cost/usd']:.4f} · {N} of {N} instances"
    assert run.info.run_name.endswith(f" · data.jsonl | {glance}")
    assert run.data.tags["mlflow.note.content"] == glance

    # the dataset input: name, source path, digest, row count
    (job,) = job_dirs(root)
    records = read_jsonl(job / "instances.jsonl")
    assert dataset.name == "data.jsonl" and dataset.source_type == "local"
    assert str(data) in dataset.source and dataset.digest == run.data.tags["dataset_digest"]
    assert '"num_rows": 20' in dataset.profile and len(records) == N
    # a fresh job: the whole job's usage is this attempt's
    m = run.data.metrics
    assert m["calls/total"] == m["calls/total/this_attempt"] == N * CALLS_PER_INSTANCE
    assert m["calls/total/earlier_attempts"] == 0 and m["cost/usd/earlier_attempts"] == 0
    assert run.data.tags["cupid.attempt"] == "1" and run.data.tags["cupid.attempt.1"].startswith("FINISHED")


def test_a_subset_is_its_own_dataset(tmp_path: Path) -> None:
    """data.limit changes the rows: the input's digest and row count say so (MLflow keys datasets by digest)."""
    from conftest import compose_config

    from cupid_exp.data.loading import load_instances
    from cupid_exp.job import typed_config
    from cupid_exp.tracking.live import dataset_digest, dataset_input

    full_cfg = typed_config(compose_config([f"paths.output_root={tmp_path}"])).data
    part_cfg = typed_config(compose_config([f"paths.output_root={tmp_path}", "data.limit=3"])).data
    full, part = load_instances(full_cfg), load_instances(part_cfg)
    assert dataset_digest(full_cfg, full) == full.digest != dataset_digest(part_cfg, part)
    entity = dataset_input(part_cfg, part).entity()
    # its name says it is a part of the file, not another version of it
    assert entity.name == "cupid-sample [data.limit=3]" and '"num_rows": 3' in entity.profile
    assert entity.source_type == "local" and dataset_input(full_cfg, full).entity().name == "cupid-sample"
    assert job_runs(store_uri(tmp_path)) == []  # nothing was logged


def test_plots_are_drawn_from_the_records_in_dataset_order(tmp_path: Path) -> None:
    """The worker hears instances in the order they finish; its plots (bootstrap intervals included) are those
    of the records in dataset order, as the job's table."""
    import random

    from helpers.records import make_records

    from cupid_exp.tracking.live import PlotRequest

    records = make_records(n_personas=12, generation=False)
    shuffled = random.Random(1).sample(records, len(records))
    request = PlotRequest(parts=("inference",), folder=str(tmp_path / "a"), seed=0, failure_policy="exclude",
                          title_prefix="m", order=tuple(r["key"] for r in records))
    in_order = {Path(p).name: Path(p).read_bytes() for p in request.draw(records)}
    request.folder = str(tmp_path / "b")
    from_shuffled = {Path(p).name: Path(p).read_bytes() for p in request.draw(shuffled)}
    assert in_order == from_shuffled and len(in_order) == 3
    request.folder, request.order = str(tmp_path / "c"), ()
    assert {Path(p).name: Path(p).read_bytes() for p in request.draw(shuffled)} != in_order  # order matters
