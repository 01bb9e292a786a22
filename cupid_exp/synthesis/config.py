"""Typed schema of the synthesis job (``synthesize_schema``); ranges are checked by ``SynthesisConfig.check``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from cupid_exp.config import Checked, JobConfig, ModelConfig, require, require_int, require_positive

ROLES = ("persona_writer", "factor_writer", "session_writer", "user_simulator", "assistant_simulator",
         "decomposer", "validator")
PERSONA_SOURCES = ("builtin", "personahub")
UNSATISFIED_POLICIES = ("keep", "regenerate", "drop")
# llama.cpp's repetition samplers (the embedded engine passes these through; cupid_exp/llm/local.py)
EMBEDDED_SAMPLERS = ("repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty", "dry_multiplier",
                     "dry_base", "dry_allowed_length")


class SynthesisError(RuntimeError):
    """A problem outside the config that stops the job before any call; its message is one line."""


@dataclass
class SynthesisRoles:
    """One model config per role (``llm@synthesis.roles.<role>=<choice>`` swaps one)."""

    persona_writer: ModelConfig = MISSING
    factor_writer: ModelConfig = MISSING
    session_writer: ModelConfig = MISSING
    user_simulator: ModelConfig = MISSING
    assistant_simulator: ModelConfig = MISSING
    decomposer: ModelConfig = MISSING
    validator: ModelConfig = MISSING


@dataclass
class PersonaHubConfig:
    name: str = "proj-persona/PersonaHub"  # the Hugging Face dataset of persona seeds
    subset: str = "instruction"  # its subset
    split: str = "train"  # its split
    text_field: str = "input persona"  # the column holding a persona's text


@dataclass
class SynthesisConfig(Checked):
    name: str = MISSING  # short id used in the job dir and the MLflow run name
    roles: SynthesisRoles = field(default_factory=SynthesisRoles)  # the model of each role (below)
    n_personas: int = 2  # personas to write; a rerun with more tops up the same job
    seed: int = 0  # structure: persona attributes, seeds, journey positions, dropped sessions
    persona_source: str = "builtin"  # builtin | personahub
    personahub: PersonaHubConfig = field(default_factory=PersonaHubConfig)  # where persona_source=personahub reads
    max_retries: int = 3  # extra attempts when an artefact fails validation or cannot be parsed
    max_turns: int = 4  # assistant replies per simulated dialogue (each is scored by the user simulator)
    on_unsatisfied: str = "keep"  # keep (flagged) | regenerate (then drop) | drop: instances using it
    with_resources: bool = False  # sessions may carry a [resource] (document, code, data) in the request
    max_checklist_items: int = 4  # checklist items kept from a decomposed preference
    validate: bool = True  # the LLM validation pass (paper App. E)
    # llama.cpp sampler settings added to every call of a role on an embedded model (API roles never get
    # them): a 135M model loops ("X and X and X ...") without a repetition penalty
    embedded_sampling: Dict[str, float] = field(default_factory=dict)

    def check(self, where: str) -> None:
        """Value checks a dataclass cannot express (the role models are checked as ModelConfigs)."""
        for key, low in (("n_personas", 1), ("max_retries", 0), ("max_turns", 1), ("max_checklist_items", 1)):
            require_int(f"{where}.{key}", getattr(self, key), low)
        require(self.persona_source in PERSONA_SOURCES, f"{where}.persona_source", self.persona_source,
                f"one of {list(PERSONA_SOURCES)}")
        for key, value in self.embedded_sampling.items():
            require(key in EMBEDDED_SAMPLERS, f"{where}.embedded_sampling.{key}", key,
                    f"one of {list(EMBEDDED_SAMPLERS)}")
            require_positive(f"{where}.embedded_sampling.{key}", value, allow_zero=True)
        require(self.on_unsatisfied in UNSATISFIED_POLICIES, f"{where}.on_unsatisfied", self.on_unsatisfied,
                f"one of {list(UNSATISFIED_POLICIES)}")


@dataclass
class SynthesizeConfig(JobConfig):
    """One synthesis job: the recipe, plus what every job has (tracking, runtime, prompts, paths)."""

    synthesis: SynthesisConfig = MISSING

    def roles(self) -> dict[str, ModelConfig]:
        return {f"synthesis.roles.{role}": getattr(self.synthesis.roles, role) for role in ROLES}


#: What does not shape a persona's artefacts: a rerun with more personas tops up the same job (its folder, its
#: journal, its MLflow run).
NOT_IDENTITY = ("synthesis.n_personas",)


def fingerprint(synthesis: DictConfig | Mapping[str, object], prompts_dir: str | None = None) -> str:
    """Short hash of what shapes a persona's artefacts, by content: names the job folder, so a changed recipe never
    mixes with old artefacts and a faster setting of the same recipe resumes."""
    from cupid_exp.identity import content_digest

    data = OmegaConf.to_container(synthesis, resolve=True) if OmegaConf.is_config(synthesis) else dict(synthesis)
    return content_digest({"synthesis": data}, NOT_IDENTITY, length=8, prompts_dir=prompts_dir)


def register_synthesis_configs() -> None:
    ConfigStore.instance().store(name="synthesize_schema", node=SynthesizeConfig)
    if not OmegaConf.has_resolver("synthesis_fingerprint"):
        OmegaConf.register_new_resolver("synthesis_fingerprint", fingerprint)
