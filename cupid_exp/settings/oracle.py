"""oracle: only the prior sessions sharing the current context factor and preference (paper §4.1). Not 2 of them is a
counted data warning (``data/oracle_count_warnings``); the instance still runs."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from cupid_exp.config import SettingConfig
from cupid_exp.config_checks import require_int
from cupid_exp.data.schema import Instance, relevant_positions
from cupid_exp.results import SettingOutput
from cupid_exp.settings import register
from cupid_exp.settings.base import Setting, View

log = logging.getLogger(__name__)


@dataclass
class OracleConfig(SettingConfig):
    name: str = "oracle"
    expected_oracle_sessions: int = 2  # CUPID has exactly 2; any other count is a data warning

    def check(self, where: str) -> None:
        require_int(f"{where}.expected_oracle_sessions", self.expected_oracle_sessions, 1)


@register
class Oracle(Setting):
    Config = OracleConfig

    def positions(self, instance: Instance) -> list[int]:
        return relevant_positions(instance)

    async def view(self, instance, ctx, transcript) -> View:
        view = await super().view(instance, ctx, transcript)
        expected = self.config.expected_oracle_sessions
        if len(view.positions) == expected:
            return view
        warning = f"oracle kept {len(view.positions)} sessions, expected {expected}"
        log.warning("data warning: %s: %s", instance.key, warning)
        return replace(view, output=SettingOutput(data_warnings=[warning]))
