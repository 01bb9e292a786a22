"""Synthesis as a job: its recipes' composition, its identity by content, value checks, failure accounting,
outcome, outputs and MLflow (the lifecycle itself: ``test_lifecycle.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.cli_runner import cli_env, seed_store
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from cupid_exp.config import ConfigError
from cupid_exp.config_store import register_configs
from cupid_exp.job import connect, execute, plan, start_tracking
from cupid_exp.synthesis.config import ROLES, SynthesizeConfig, register_synthesis_configs
from cupid_exp.synthesis.steps import factors as persona_step
from cupid_exp.synthesis.work import load_synthesis
from cupid_exp.synthesize import run_synthesis
from cupid_exp.testing.stub_llm_server import StubServer

from .scripted import ScriptedServer, reply, role_overrides

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = PROJECT_ROOT / "conf"


def compose_synthesis(overrides: list[str] | None = None, hydra: bool = False):
    register_configs()
    register_synthesis_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("synthesize", overrides=overrides or [], return_hydra_config=hydra)


def mlflow_runs(root: Path) -> list:
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    return client.search_runs([client.get_experiment_by_name("cupid-synthesis").experiment_id])


TEMPERATURES = {"persona_writer": 0.7, "factor_writer": 0.7, "session_writer": 0.7, "user_simulator": 0.3,
                "assistant_simulator": 0.7, "decomposer": 0, "validator": 0}


def test_the_bare_command_is_the_embedded_recipe_and_the_api_recipe_has_api_roles() -> None:
    """``python -m cupid_exp.synthesize`` runs where it is run: every role on the embedded model, sized for a CPU
    (synthesis=offline); ``synthesis=api`` puts every role on an API model, at the API sizes. Both keep the
    paper's temperatures."""
    cfg = compose_synthesis()
    typed = OmegaConf.to_object(cfg)
    assert isinstance(typed, SynthesizeConfig) and typed.runtime.max_failed_fraction == 0.1  # a JobConfig
    assert cfg.synthesis.name == "offline" and cfg.synthesis.max_turns == 1
    assert all(cfg.synthesis.roles[r].name == "local" and cfg.synthesis.roles[r].local for r in ROLES)
    api = compose_synthesis(["synthesis=api"])
    assert api.synthesis.max_turns == 4 and api.synthesis.max_checklist_items == 4
    assert all(api.synthesis.roles[r].name == "gpt4o_eval" and not api.synthesis.roles[r].local for r in ROLES)
    for recipe in (cfg, api):
        assert {r: recipe.synthesis.roles[r].params.temperature for r in ROLES} == TEMPERATURES
    assert cfg.tracking.experiment == "cupid-synthesis" and cfg.tracking.uri.startswith("sqlite:///")


def test_the_offline_recipe_is_the_api_recipe_on_the_embedded_model_with_smaller_dialogues() -> None:
    """synthesis=offline changes the models and the sizes that cost CPU time, nothing else."""
    api, offline = (OmegaConf.to_container(compose_synthesis([f"synthesis={name}"]).synthesis)
                    for name in ("api", "offline"))
    assert (offline["max_turns"], offline["max_checklist_items"]) == (1, 2) != (api["max_turns"],
                                                                            api["max_checklist_items"])
    assert offline["roles"]["assistant_simulator"]["params"]["max_tokens"] == 96
    for key in ("name", "max_turns", "max_checklist_items"):
        offline.pop(key), api.pop(key)
    for recipe in (api, offline):
        recipe["roles"] = {role: {"temperature": model["params"]["temperature"]}
                           for role, model in recipe["roles"].items()}
    assert offline == api


def test_one_role_can_be_swapped_and_keeps_its_role_temperature() -> None:
    cfg = compose_synthesis(["llm@synthesis.roles.user_simulator=gpt4o_eval"])
    assert cfg.synthesis.roles.user_simulator.litellm_model == "openai/gpt-4o-2024-11-20"
    assert cfg.synthesis.roles.user_simulator.params.temperature == 0.3
    assert cfg.synthesis.roles.session_writer.name == "local"


def test_job_dir_is_stable_for_a_command_and_differs_by_recipe() -> None:
    def run_dir(overrides: list[str]) -> str:
        return compose_synthesis(overrides, hydra=True).hydra.run.dir

    assert run_dir(["synthesis.n_personas=2"]) == run_dir(["synthesis.n_personas=5"])  # top-up resumes
    # pinned: a new optional (null) setting must not move every job folder (nulls are left out of the hash)
    # (moved from ..._21e1ff6a when conf/llm/local.yaml set n_threads 1 and n_threads_batch 2: a config value
    # that changed, not a null; with n_threads=2 and n_threads_batch=null on every role the old hash comes back)
    # (moved from ..._952b87cc when the recipe gained embedded_sampling, the repetition samplers of the local model)
    # (moved from ..._bf8ecab3 when conf/llm/local.yaml gained the DRY sampler and step_params: config values)
    # (moved from default_local_seed0_64ab4f54 when the folder became a hash of the recipe's content: no role's
    # throughput, threads, prices or key variable; and the bare command's recipe became synthesis=offline)
    assert run_dir([]) == "outputs/synthesis/offline_local_seed0_0f27b137"
    assert run_dir([]) != run_dir(["synthesis.max_turns=2"])
    assert run_dir([]) != run_dir(["synthesis.seed=1"])
    assert run_dir([]) != run_dir(["synthesis.roles.decomposer.params.temperature=0.5"])


# Each: how a role's endpoint is reached, not what it answers; none moves the job (its folder, its identity).
NOT_CONTENT = [["synthesis.roles.user_simulator.max_concurrency=64"],
               ["synthesis.roles.user_simulator.pool.rpm=300", "synthesis.roles.user_simulator.pool.tpm=40000"],
               ["synthesis.roles.user_simulator.api_base=http://localhost:8000/v1/"],
               ["+synthesis.roles.user_simulator.params.extra_headers={Authorization: 'Bearer sk-rotated-1234'}"],
               ["calls.timeout=30", "calls.num_retries=7", "runtime.workers=2", "calls.cache=false"],
               ["synthesis.roles.user_simulator.model_info.input_cost_per_token=1e-06"],
               ["synthesis.roles.user_simulator.api_key_env=MY_KEY"]]
HEADER = "+synthesis.roles.user_simulator.params.extra_headers={Authorization: 'Bearer sk-first-5678'}"


@pytest.mark.parametrize("changed", NOT_CONTENT, ids=[c[0].split("=")[0] for c in NOT_CONTENT])
def test_how_an_endpoint_is_reached_changes_neither_the_folder_nor_the_identity(tmp_path: Path, changed) -> None:
    base = ["synthesis=api", *role_overrides("http://127.0.0.1:8000/v1"), "tracking=none",
            f"paths.output_root={tmp_path}"]
    if changed[0].startswith("+synthesis.roles.user_simulator.params.extra_headers"):
        base.append(HEADER)  # a header whose value (a token) is rotated
        changed = [changed[0].removeprefix("+")]

    def job(overrides: list[str]) -> tuple[str, str]:
        folder = compose_synthesis([*base, *overrides], hydra=True).hydra.run.dir
        cfg = compose_synthesis([*base, *overrides])
        planned = plan(cfg, tmp_path / "job", kind=load_synthesis, clients=False)
        planned.release()
        return folder, planned.identity

    folder, identity = job([])
    assert job(changed) == (folder, identity)
    hotter = job(["synthesis.roles.user_simulator.params.temperature=0.9"])  # what changes a reply: a new job
    assert hotter[0] != folder and hotter[1] != identity


@pytest.mark.parametrize("override,key", [("synthesis.on_unsatisfied=maybe", "synthesis.on_unsatisfied"),
                                          ("synthesis.n_personas=0", "synthesis.n_personas"),
                                          ("synthesis.max_retries=-1", "synthesis.max_retries"),
                                          ("calls.batch=true", "calls.batch"),
                                          ("synthesis.roles.validator.batch=true", "synthesis.roles.validator.batch"),
                                          ("synthesis.persona_source=web", "synthesis.persona_source"),
                                          ("synthesis.roles.validator.max_concurrency=0",
                                           "synthesis.roles.validator.max_concurrency"),
                                          ("calls.dry_run=true", "calls.dry_run"),
                                          ("runtime.epochs=2", "runtime.epochs"),
                                          ("+synthesis.embedded_sampling.min_p=0.1",
                                           "synthesis.embedded_sampling.min_p"),
                                          ("synthesis.embedded_sampling.repeat_penalty=-1",
                                           "synthesis.embedded_sampling.repeat_penalty"),
                                          ("+synthesis.max_turn=2", "synthesis.max_turn")])
def test_bad_values_fail_before_any_call_with_one_line(tmp_path, override: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan(compose_synthesis([override, f"paths.output_root={tmp_path}"]), tmp_path / "job", kind=load_synthesis)
    assert str(err.value).startswith(key) and "\n" not in str(err.value)
    assert not (tmp_path / "job").exists()


def test_misspelt_key_fails_at_composition() -> None:
    with pytest.raises(ConfigCompositionException):
        compose_synthesis(["synthesis.n_personaz=2"])


def test_bad_model_output_fails_personas_and_the_job_ends_incomplete(tmp_path: Path) -> None:
    """Every reply is garbage: each persona fails at its first phase, counted; outputs and MLflow still land,
    and the job exits 3 (more than runtime.max_failed_fraction of the personas failed)."""
    with ScriptedServer([reply("I cannot write JSON.")]) as server:
        cmd = [sys.executable, "-m", "cupid_exp.synthesize", "synthesis=api", "synthesis.n_personas=2",
               "synthesis.max_retries=1",
               f"paths.output_root={tmp_path / 'out'}", "calls.num_retries=0", "runtime.progress=false",
               *role_overrides(server.url, structured=False)]
        proc = subprocess.run(cmd, cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "personas: 0/2 completed" in proc.stdout
    assert "persona 1 at persona" in proc.stdout and "persona 2 at persona" in proc.stdout
    assert proc.stdout.rstrip().endswith("above runtime.max_failed_fraction=0.1: exit 3")
    assert "evaluate:" not in proc.stdout  # nothing to evaluate, and the report says why
    assert "no instances to evaluate (instances.jsonl is empty): every persona failed" in proc.stdout
    job = next((tmp_path / "out" / "synthesis").iterdir())
    attempts = [json.loads(line) for line in (job / "journeys" / "persona_001.calls.jsonl").read_text().splitlines()]
    assert [(a["step"], a["attempt"], a["rejected"]) for a in attempts] == [("persona", 0, "unparseable"),
                                                                           ("persona", 1, "unparseable")]
    assert attempts[1]["reply"] == "I cannot write JSON." and "Attempt 2" in attempts[1]["prompt_tail"]
    metrics = json.loads((job / "metrics.json").read_text())["metrics"]
    assert metrics["personas/failed/persona"] == 2
    assert metrics["calls/persona/unparseable_attempt"] == 4 and metrics["calls/persona"] == 4
    assert metrics["calls/requests"] == 4 and metrics["calls/retries"] == 0
    assert (job / "instances" / "instances.jsonl").read_text() == ""
    assert len(json.loads((job / "personas.json").read_text())) == 2
    runs = mlflow_runs(tmp_path / "out")
    assert len(runs) == 1 and runs[0].data.metrics["personas/failed"] == 2
    # an incomplete job's run says so (run_outcomes): FAILED, its outcome and reason as tags
    assert runs[0].info.status == "FAILED" and runs[0].data.tags["cupid.complete"] == "false"
    assert runs[0].data.tags["cupid.outcome"] == "incomplete"


def test_a_bug_in_a_builder_stops_the_job_and_fails_its_run(tmp_path: Path, monkeypatch) -> None:
    """A TypeError while building an artefact is not a counted failure: it leaves the pipeline, and the
    MLflow run (opened when the job started) ends FAILED."""
    def buggy(data):
        raise TypeError("a bug in the persona builder")

    monkeypatch.setattr(persona_step, "build_persona", buggy)
    with StubServer() as stub:
        cfg = compose_synthesis(["synthesis=api", *role_overrides(stub.url), "synthesis.n_personas=1",
                                 f"paths.output_root={tmp_path}", "runtime.progress=false"])
        with pytest.raises(TypeError, match="a bug in the persona builder"):
            run_synthesis(cfg, tmp_path / "job", {}, None)
        assert stub.stats()["total_completed"] == 1  # asked once: a bug is not re-asked
    runs = mlflow_runs(tmp_path)
    assert len(runs) == 1 and runs[0].info.status == "FAILED"
    journey = json.loads((tmp_path / "job" / "journeys" / "persona_001.json").read_text())
    assert "status" not in journey and "persona" not in journey
    assert not (tmp_path / "job" / "metrics.json").exists()


def test_the_run_shows_progress_while_calls_go_out_before_any_persona_is_done(tmp_path: Path) -> None:
    """A persona takes dozens of calls: the job's run, kept by its worker process, gets progress points with the
    calls made while the first persona is still being written (step 0: no persona done), at the pace of
    tracking.progress_every_s, not only when a persona is done."""
    root = tmp_path / "out"
    seed_store(root)
    with StubServer() as stub:
        cfg = compose_synthesis(["synthesis=api", "synthesis.max_turns=1", "synthesis.max_checklist_items=2",
                                 "synthesis.n_personas=1", *role_overrides(stub.url), f"paths.output_root={root}",
                                 f"calls.cache_dir={root / 'cache'}", "runtime.progress=false",
                                 "tracking.progress_every_s=0.5"])
        job = plan(cfg, root / "job", kind=load_synthesis, clients=False)
        live = start_tracking(job)
        connect(job)
        live.wait_opened()
        stub.hold_after(12)  # the first persona needs far more: none can be done while these are held
        worker = threading.Thread(target=execute, args=(job, live), daemon=True)
        worker.start()
        try:
            client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")

            def calls_before_a_persona() -> float:
                points = client.get_metric_history(live.run_id, "progress/calls")
                return max((m.value for m in points if m.step == 0), default=0.0)

            assert stub.wait_held(timeout=60)
            deadline = time.monotonic() + 30
            while calls_before_a_persona() < 12 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert calls_before_a_persona() >= 12, "no progress point with the calls made before a persona was done"
            journalled = [p.read_text() for p in (root / "journal").glob("*.jsonl")]
            assert stub.stats()["held"] >= 1 and not any(journalled)  # still held, no persona done
        finally:
            stub.release()
            worker.join(120)
            live.end("KILLED")
            job.release()
