"""Shared test setup: offline env, a per-test output root, and Hydra compose helpers."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from cupid_exp.config_store import register_configs  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = PROJECT_ROOT / "conf"


def compose_config(overrides: list[str] | None = None, *, return_hydra_config: bool = False) -> DictConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides or [], return_hydra_config=return_hydra_config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first (``longest``: minutes; then ``slow``), the rest after in their order: with
    ``--dist worksteal`` the first worker starts on them while the other takes the rest, and an idle worker takes
    half of a busy one's queue, so the two end together instead of one being left alone with a long test."""
    items.sort(key=lambda item: (item.get_closest_marker("longest") is None, item.get_closest_marker("slow") is None))


@pytest.fixture(autouse=True)
def _no_tracking_uri_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job config honours $MLFLOW_TRACKING_URI, and ``mlflow.set_tracking_uri`` in one in-process test would
    export it to every later CLI run: each test starts without it (tests of the variable set it themselves)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(autouse=True)
def _no_worker_left_between_tests():
    """A sweep's MLflow worker waits in its process for the next job: a test that leaves one (a sweep callback or a
    job with a parent run, in-process) has it stopped here, so that no later test takes it."""
    yield
    from cupid_exp.tracking import run_worker

    run_worker.quit_idle()


@pytest.fixture(scope="session", autouse=True)
def _sweep_workers_stopped_at_the_end():
    """A sweep's loky workers kept for the next in-process run (``helpers.sweep_workers``) are stopped by force when
    the session ends: left to loky's exit hook, an idle worker's own exit can hang it."""
    yield
    from helpers import sweep_workers

    sweep_workers.release()


@pytest.fixture
def output_root(tmp_path: Path) -> Path:
    root = tmp_path / "outputs"
    root.mkdir()
    return root
