"""Entry point of synthesis: ``python -m cupid_exp.synthesize [overrides]`` or ``cupid-synthesize``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from cupid_exp.entry import hydra_entry, run_job_entry
from cupid_exp.errors import ConfigError, Outcome
from cupid_exp.synthesis.config import SynthesisError, register_synthesis_configs

if TYPE_CHECKING:
    from cupid_exp.tracking.mlflow import SweepParent


def run_synthesis(cfg: DictConfig, output_dir: Path, choices: dict[str, str] | None = None,
                  parent_run: str | SweepParent | None = None) -> Outcome:
    """One synthesis job end to end, through the job lifecycle (``cupid_exp.job``) with personas as its units."""
    from cupid_exp.job import run_job
    from cupid_exp.synthesis.work import load_synthesis

    return run_job(cfg, output_dir, choices, parent_run, kind=load_synthesis)


def synthesize(cfg: DictConfig) -> float | None:
    from cupid_exp.llm.retry import FatalProviderError

    return run_job_entry(cfg, "cupid_exp.synthesize", run_synthesis, (ConfigError, SynthesisError, FatalProviderError))


main = hydra_entry("synthesize", synthesize, register_synthesis_configs)

if __name__ == "__main__":
    main()
