"""``runtime.epochs=K``: every instance run K times, each epoch a unit of its own (its seed, its cache entry, its
journal line), priced ×K by the dry run, its metrics per epoch and their mean; with K = 1 nothing changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import compose_config
from helpers.jobs import stub_config

from cupid_exp.data.schema import Instance
from cupid_exp.evaluation import plan, run_evaluation
from cupid_exp.testing.stub_config import StubConfig
from cupid_exp.testing.stub_llm_server import StubServer


def _run(url: str, root: Path, *overrides: str) -> dict:
    outcome = run_evaluation(stub_config(url, root, f"calls.cache_dir={root / 'cache'}", *overrides), root / "job")
    assert outcome.outcome == "ok", outcome
    return json.loads((root / "job" / "metrics.json").read_text())


def _records(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "job" / "instances.jsonl").read_text().splitlines()]


def test_one_epoch_sends_records_and_names_what_it_did_before(tmp_path: Path) -> None:
    with StubServer(StubConfig(record_bodies=True)) as stub:
        _run(stub.url, tmp_path / "plain")
        before = list(stub.bodies)
        stub.bodies.clear()
        _run(stub.url, tmp_path / "one", "runtime.epochs=1")
        once = list(stub.bodies)
    assert before and all("seed" not in body for body in before + once)  # no seed the config did not ask for
    assert sorted(map(json.dumps, once)) == sorted(map(json.dumps, before))
    assert all("epoch" not in r and "#" not in r["key"] for r in _records(tmp_path / "one"))
    plain = plan(stub_config(stub.url, tmp_path / "p"), tmp_path / "p" / "job", clients=False)
    one = plan(stub_config(stub.url, tmp_path / "o", "runtime.epochs=1"), tmp_path / "o" / "job", clients=False)
    three = plan(stub_config(stub.url, tmp_path / "t", "runtime.epochs=3"), tmp_path / "t" / "job", clients=False)
    try:
        assert plain.identity == one.identity != three.identity  # one epoch keeps the job's old identity
        assert all(type(u) is Instance for u in one.work.units)
    finally:
        for job in (plain, one, three):
            job.release()


def test_each_epoch_is_its_own_draw_and_cache_entry(tmp_path: Path) -> None:
    with StubServer(StubConfig(record_bodies=True)) as stub:
        _run(stub.url, tmp_path / "one")
        sent_once = stub.stats()["total_completed"]
        stub.reset()
        stub.bodies.clear()
        metrics = _run(stub.url, tmp_path / "three", "runtime.epochs=3", "+model.params.seed=7")["metrics"]
        bodies = list(stub.bodies)
        first = stub.stats()
        stub.reset()
        _run(stub.url, tmp_path / "again", "runtime.epochs=3", "+model.params.seed=7",
             f"calls.cache_dir={tmp_path / 'three' / 'cache'}")
        again = stub.stats()
    # each epoch went out (none answered by another epoch's cached reply), seeded the model's seed + epoch
    assert first["total_completed"] == first["distinct_completed"] == 3 * sent_once
    # the subject's seed 7 + epoch; the evaluator's models, which have none: 0 + epoch
    seeds = [b.get("seed") for b in bodies]
    assert set(seeds) == {0, 1, 2, 7, 8, 9}
    assert [seeds.count(e) + seeds.count(7 + e) for e in range(3)] == [sent_once] * 3
    assert again["total_completed"] == 0  # and each epoch's replies are found again in its own cache entries
    records = _records(tmp_path / "three")
    assert sorted(r["key"] for r in records) == sorted(f"{k}#{e}" for k in {r["key"].split("#")[0] for r in records}
                                                       for e in range(3))
    assert metrics["instances/total"] == len(records) == 3 * metrics["epoch/0/inference/n"]
    per_epoch = [metrics[f"epoch/{e}/inference/f1"] for e in range(3)]
    assert metrics["epoch/mean/inference/f1"] == pytest.approx(sum(per_epoch) / 3)


def test_per_epoch_metrics_and_their_mean_go_to_mlflow(tmp_path: Path) -> None:
    from helpers.cli_runner import seed_store
    from helpers.tracking_runs import only_run, store_uri

    from cupid_exp.testing.cupid_data import SAMPLE_FULL_PATH

    seed_store(tmp_path)  # MLflow's schema migrations are not what this test is about
    with StubServer() as stub:
        outcome = run_evaluation(stub_config(stub.url, tmp_path, "runtime.epochs=2", "tracking=mlflow",
                                             f"tracking.uri={store_uri(tmp_path)}", "data=local",
                                             f"data.path={SAMPLE_FULL_PATH}", "data.limit=2"), tmp_path / "job")
    assert outcome.outcome == "ok"
    logged = only_run(store_uri(tmp_path)).data.metrics
    for name in ("inference/f1", "inference/precision", "inference/recall"):
        epochs = [logged[f"epoch/{e}/{name}"] for e in (0, 1)]
        assert logged[f"epoch/mean/{name}"] == pytest.approx(sum(epochs) / 2)
    assert logged["instances/total"] == 4


def test_the_dry_run_prices_every_epoch(tmp_path: Path) -> None:
    def dry(root: Path, *overrides: str) -> dict:
        cfg = compose_config(["model=gpt4o", "calls.dry_run=true", "tracking=none", "runtime.progress=false",
                              f"paths.output_root={root}", *overrides])
        assert run_evaluation(cfg, root / "job").outcome == "ok"
        return json.loads((root / "job" / "metrics.json").read_text())["metrics"]

    one, three = dry(tmp_path / "one"), dry(tmp_path / "three", "runtime.epochs=3")
    assert one["cost/usd"] > 0 and one["calls/total"] > 0
    assert three["calls/total"] == 3 * one["calls/total"]
    assert three["cost/usd"] == pytest.approx(3 * one["cost/usd"], rel=0.02)  # a seed's tokens aside


def test_worker_processes_run_each_instance_epoch_once(tmp_path: Path) -> None:
    """runtime.workers=2 (processes: the CLI): the epochs travel to the workers as units, seeded there."""
    from helpers.cli_runner import cli_command, job_dirs, read_jsonl, run_cli

    from cupid_exp.testing.cupid_data import write_dataset

    data = write_dataset(tmp_path / "data.jsonl", 4)
    with StubServer(StubConfig(record_bodies=True)) as stub:
        proc = run_cli(cli_command(stub.url, tmp_path, "tracking=none", "runtime.workers=2", "runtime.epochs=2",
                                   cache_dir=tmp_path / "cache", data=data))
        stats, seeds = stub.stats(), [b.get("seed") for b in stub.bodies]
    assert "model calls shared by 2 processes" in proc.stdout + proc.stderr  # the workers really ran
    assert stats["total_completed"] == stats["distinct_completed"] == 2 * 4 * 4  # 4 calls per instance and epoch
    assert seeds.count(0) == seeds.count(1) == 16
    records = read_jsonl(job_dirs(tmp_path)[0] / "instances.jsonl")
    assert sorted(r["epoch"] for r in records) == [0] * 4 + [1] * 4 and len({r["key"] for r in records}) == 8
