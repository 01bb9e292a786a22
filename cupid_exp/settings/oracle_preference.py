"""oracle_preference (generation only): the model gets the true preference (paper §4.1), the log if ``include_log``."""

from __future__ import annotations

from dataclasses import dataclass, replace

from cupid_exp.config import SettingConfig
from cupid_exp.settings import register
from cupid_exp.settings.base import Setting, View


@dataclass
class OraclePreferenceConfig(SettingConfig):
    name: str = "oracle_preference"
    include_log: bool = False  # also show the session log beside the true preference


@register
class OraclePreference(Setting):
    Config = OraclePreferenceConfig
    tasks = ("generation",)
    generation_fields = frozenset({"preference"})

    @property
    def generation_prompt(self) -> str:
        return "evaluation/response_generator_oracle_preference" + ("_log" if self.config.include_log else "")

    async def view(self, instance, ctx, transcript) -> View:
        view = await super().view(instance, ctx, transcript)
        return replace(view, generation_prompt=self.generation_prompt,
                       generation_values={"preference": instance.current_contextual_preference})
