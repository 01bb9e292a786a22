"""standard: all prior sessions, rendered as the interaction log, then the current request."""

from __future__ import annotations

from dataclasses import dataclass

from cupid_exp.config import SettingConfig
from cupid_exp.settings import register
from cupid_exp.settings.base import Setting


@dataclass
class StandardConfig(SettingConfig):
    name: str = "standard"


@register
class Standard(Setting):
    Config = StandardConfig
