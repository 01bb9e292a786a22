"""Settings: what the model sees of an instance's history, registered by name (paper §4.1 and ours). A setting is its
module (found and imported on its own) and its ``conf/setting/<name>.yaml``."""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from cupid_exp.config import ConfigError

if TYPE_CHECKING:
    from cupid_exp.config import SettingConfig
    from cupid_exp.settings.base import Setting

SETTINGS: dict[str, type["Setting"]] = {}


def register(cls: type["Setting"]) -> type["Setting"]:
    """Registers the setting under its ``Config``'s name, which is its ``name`` too (one spelling, no mismatch)."""
    cls.name = cls.Config.name
    SETTINGS[cls.name] = cls
    return cls


def _load_all() -> None:
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base":
            importlib.import_module(f"{__name__}.{module.name}")


def register_setting_schemas() -> None:
    """Store each setting's schema as ``<name>_setting_schema`` at the root (inside ``setting``, --help lists it)."""
    from hydra.core.config_store import ConfigStore

    _load_all()
    store = ConfigStore.instance()
    for name, cls in SETTINGS.items():
        store.store(name=f"{name}_setting_schema", node=cls.Config)


def make_setting(config: "SettingConfig") -> "Setting":
    _load_all()
    if config.name not in SETTINGS:
        raise ConfigError(f"setting.name={config.name!r} is not a registered setting; choose one of {sorted(SETTINGS)}")
    return SETTINGS[config.name](config)
