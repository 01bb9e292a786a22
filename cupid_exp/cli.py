"""Entry point: ``python -m cupid_exp [overrides]`` or ``cupid-exp [overrides]`` (add ``-m`` for sweeps)."""

from __future__ import annotations

from omegaconf import DictConfig

from cupid_exp.data.schema import DataError
from cupid_exp.entry import hydra_entry, run_job_entry
from cupid_exp.errors import ConfigError


def evaluate(cfg: DictConfig) -> float | None:
    from cupid_exp.evaluation import run_evaluation
    from cupid_exp.llm.retry import FatalProviderError

    return run_job_entry(cfg, "cupid_exp", run_evaluation, (ConfigError, DataError, FatalProviderError))


main = hydra_entry("config", evaluate)

if __name__ == "__main__":
    main()
