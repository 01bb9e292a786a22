"""Settings decide which prior sessions (or derived text) the model sees for an instance."""

from __future__ import annotations

from cupid_exp.config import SettingConfig
from cupid_exp.data.schema import Instance, PriorSession

SETTINGS = ("standard",)


def validate_setting(setting: SettingConfig, task: str) -> None:
    if setting.name not in SETTINGS:
        raise ValueError(f"setting={setting.name!r} is not available; choose one of {list(SETTINGS)}")


def context_sessions(instance: Instance, setting: SettingConfig) -> list[PriorSession]:
    """Standard: all prior sessions, in order."""
    return list(instance.prior_interactions)
