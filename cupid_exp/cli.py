"""Hydra entry point: ``python -m cupid_exp [overrides]`` (add ``-m`` for sweeps)."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports litellm

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from cupid_exp.config import register_configs  # noqa: E402

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
register_configs()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> float | None:
    from cupid_exp.runner import run_job
    from cupid_exp.tracking import parent_run_id

    from cupid_exp.data.schema import DataError
    from cupid_exp.settings import ConfigError

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        result = run_job(cfg, Path(hc.runtime.output_dir), choices=dict(hc.runtime.choices),
                         parent_run=parent_run_id(hc.sweep.dir) if multirun else None)
    except (ConfigError, DataError) as exc:  # a bad combination or (data.strict) a bad row: one line, no call
        print(f"cupid_exp: {exc}", file=sys.stderr)
        sys.exit(2)
    return result.metrics.get(f"{cfg.task.name}/f1", result.metrics.get("generation/score"))
