"""What a setting is: a rule for what the model sees of an instance's history (paper §4.1). It turns an instance into a
``View``; the job, journal and report ask the setting object instead of comparing names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

from cupid_exp.config import ConfigError, SettingConfig
from cupid_exp.data.schema import Instance, PriorSession
from cupid_exp.rendering import interaction_log
from cupid_exp.results import SettingOutput

if TYPE_CHECKING:
    from cupid_exp.llm.steps import Transcript
    from cupid_exp.tasks.context import TaskContext

GENERATION_PROMPT = "evaluation/response_generator"


@dataclass(frozen=True)
class View:
    """What a setting shows the model of one instance."""

    log_text: str  #: fills the prompts' {interaction_log}: the dialogues, or their summaries
    positions: list[int]  #: 1-based positions of the prior sessions shown, in their original order
    generation_prompt: str = GENERATION_PROMPT  #: the prompt file the generation task uses
    generation_values: Mapping[str, Any] = field(default_factory=dict)  #: extra placeholders for it
    output: SettingOutput = field(default_factory=SettingOutput)  #: what the setting adds to the record


class Setting:
    """Base class: every prior session, rendered as the log (the paper's standard setting)."""

    name: ClassVar[str]  #: its ``Config``'s name (``register`` sets it)
    Config: ClassVar[type[SettingConfig]]
    tasks: ClassVar[tuple[str, ...]] = ("inference", "generation")  #: the task parts it is defined for
    stages: ClassVar[tuple[str, ...]] = ()  #: work before the tasks that gets its own progress bar
    generation_fields: ClassVar[frozenset[str]] = frozenset()  #: placeholders it adds to the generation prompt

    def __init__(self, config: SettingConfig):
        self.config = config

    @property
    def generation_prompt(self) -> str:
        return GENERATION_PROMPT

    def own_prompts(self) -> dict[str, set[str]]:
        """Prompt files the setting itself sends, with the placeholders it fills (checked before any call)."""
        return {}

    def positions(self, instance: Instance) -> list[int]:
        return list(range(1, len(instance.prior_interactions) + 1))

    def sessions(self, instance: Instance, positions: Sequence[int]) -> list[PriorSession]:
        return [instance.prior_interactions[i - 1] for i in positions]

    async def view(self, instance: Instance, ctx: TaskContext, transcript: Transcript) -> View:
        """The view of ``instance``; raises StepFailed when the setting's own model step fails."""
        positions = self.positions(instance)
        return View(interaction_log(self.sessions(instance, positions)), positions)

    def check_parts(self, parts: Sequence[str]) -> None:
        unsupported = [p for p in parts if p not in self.tasks]
        if unsupported:
            raise ConfigError(f"setting={self.name} is defined for {'/'.join(self.tasks)} only, so it cannot run "
                              f"task part(s) {unsupported}; choose task={'/'.join(self.tasks)} or another setting")

    def metrics(self, records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """Metrics the setting adds to the job's (e.g. retrieval recall@k); none by default."""
        return {}

    def label(self) -> str:
        """The setting's column label in reports (variants differ by their parameters)."""
        return self.name
