"""Hydra entry point of synthesis: ``python -m cupid_exp.synthesize [overrides]`` (``-m`` for sweeps)."""

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
from cupid_exp.synthesis.config import register_synthesis_configs  # noqa: E402

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
register_configs()
register_synthesis_configs()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="synthesize")
def main(cfg: DictConfig) -> float | None:
    from cupid_exp.synthesis.config import SynthesisError
    from cupid_exp.synthesis.pipeline import run_synthesis
    from cupid_exp.tracking import parent_run_id

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        result = run_synthesis(cfg, Path(hc.runtime.output_dir), choices=dict(hc.runtime.choices),
                               parent_run=parent_run_id(hc.sweep.dir) if multirun else None)
    except SynthesisError as exc:  # a bad value or an unreachable seed source: one line, no traceback
        print(f"cupid_exp.synthesize: {exc}", file=sys.stderr)
        sys.exit(2)
    return result.metrics.get("instances/count")


if __name__ == "__main__":
    main()
