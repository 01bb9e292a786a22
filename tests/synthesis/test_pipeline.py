"""The job around the steps: composition, failure accounting, outputs and MLflow, without a real model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cupid_exp.config import register_configs
from cupid_exp.synthesis.config import ROLES, SynthesisError, check_synthesis_config, register_synthesis_configs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "llm"))  # the scripted fault server
from fault_server import ScriptedServer, completion_body  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = PROJECT_ROOT / "conf"


def compose_synthesis(overrides: list[str] | None = None, hydra: bool = False):
    register_configs()
    register_synthesis_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("synthesize", overrides=overrides or [], return_hydra_config=hydra)


def test_defaults_compose_with_paper_temperatures_per_role() -> None:
    cfg = compose_synthesis()
    OmegaConf.to_object(cfg)
    temps = {r: cfg.synthesis.roles[r].params.temperature for r in ROLES}
    assert temps == {"persona_writer": 0.7, "factor_writer": 0.7, "session_writer": 0.7, "user_simulator": 0.3,
                     "assistant_simulator": 0.7, "decomposer": 0, "validator": 0}
    assert all(cfg.synthesis.roles[r].name == "local" for r in ROLES)
    assert cfg.tracking.experiment == "cupid-synthesis" and cfg.tracking.uri.startswith("sqlite:///")


def test_one_role_can_be_swapped_and_keeps_its_role_temperature() -> None:
    cfg = compose_synthesis(["model@synthesis.roles.user_simulator=gpt4o_eval"])
    assert cfg.synthesis.roles.user_simulator.litellm_model == "openai/gpt-4o-2024-11-20"
    assert cfg.synthesis.roles.user_simulator.params.temperature == 0.3
    assert cfg.synthesis.roles.session_writer.name == "local"


def test_job_dir_is_stable_for_a_command_and_differs_by_recipe() -> None:
    def run_dir(overrides: list[str]) -> str:
        return compose_synthesis(overrides, hydra=True).hydra.run.dir

    assert run_dir(["synthesis.n_personas=2"]) == run_dir(["synthesis.n_personas=5"])  # top-up resumes
    assert run_dir([]) != run_dir(["synthesis.max_turns=2"])
    assert run_dir([]) != run_dir(["synthesis.seed=1"])


def test_bad_values_fail_before_any_call() -> None:
    with pytest.raises(Exception):
        compose_synthesis(["synthesis.n_personaz=2"])
    cfg = OmegaConf.to_object(compose_synthesis(["synthesis.on_unsatisfied=maybe"]).synthesis)
    with pytest.raises(SynthesisError, match="on_unsatisfied"):
        check_synthesis_config(cfg)


def test_bad_model_output_fails_personas_not_the_run(tmp_path: Path) -> None:
    """Every reply is garbage: each persona fails at its first phase, counted; outputs and MLflow still land."""
    from mlflow.tracking import MlflowClient

    with ScriptedServer([(200, completion_body("I cannot write JSON."), {})]) as server:
        role_overrides = []
        for role in ROLES:
            role_overrides += [f"model@synthesis.roles.{role}=openai_compatible",
                               f"synthesis.roles.{role}.api_base={server.url}"]
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}
        cmd = [sys.executable, "-m", "cupid_exp.synthesize", "synthesis.n_personas=2", "synthesis.max_retries=1",
               f"paths.output_root={tmp_path / 'out'}", f"runtime.cache_dir={tmp_path / 'cache'}",
               "runtime.num_retries=0", *role_overrides]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "personas: 0/2 completed" in proc.stdout
    assert "persona 1 at persona" in proc.stdout and "persona 2 at persona" in proc.stdout
    job = next((tmp_path / "out" / "synthesis").iterdir())
    metrics = json.loads((job / "metrics.json").read_text())["metrics"]
    assert metrics["personas/failed/persona"] == 2
    assert metrics["errors/persona/unparseable_attempt"] == 4 and metrics["errors/persona/gave_up"] == 2
    assert (job / "instances" / "instances.jsonl").read_text() == ""
    assert len(json.loads((job / "personas.json").read_text())) == 2
    client = MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("cupid-synthesis").experiment_id])
    assert len(runs) == 1 and runs[0].data.metrics["personas/failed"] == 2
