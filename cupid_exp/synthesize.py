"""Entry point of synthesis: ``python -m cupid_exp.synthesize [overrides]`` or ``cupid-synthesize``."""

from __future__ import annotations

from omegaconf import DictConfig

from cupid_exp.entry import hydra_entry, run_job_entry
from cupid_exp.synthesis.config import register_synthesis_configs


def synthesize(cfg: DictConfig) -> float | None:
    from cupid_exp.config import ConfigError
    from cupid_exp.llm.retry import FatalProviderError
    from cupid_exp.synthesis.config import SynthesisError
    from cupid_exp.synthesis.pipeline import run_synthesis

    return run_job_entry(cfg, "cupid_exp.synthesize", run_synthesis, (ConfigError, SynthesisError, FatalProviderError))


main = hydra_entry("synthesize", synthesize, register_synthesis_configs)

if __name__ == "__main__":
    main()
