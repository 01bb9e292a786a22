"""The config schemas registered in Hydra's ConfigStore, done where a Hydra entry starts.

Registering needs every setting module (each carries its own schema, ``cupid_exp.settings``), so it lives here, at
the entry, and not in ``cupid_exp.config``: importing the schema then imports nothing above it. Called by
``entry.hydra_entry`` and by what composes configs without an entry (``reporting.diff_compose``, the tests).
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from cupid_exp.config import RunConfig


def register_configs() -> None:
    """Register the entry schema, every setting's schema (group ``setting``) and the folder-name resolver."""
    from cupid_exp.outputs import register_resolvers
    from cupid_exp.settings import register_setting_schemas

    register_resolvers()
    ConfigStore.instance().store(name="run_schema", node=RunConfig)
    register_setting_schemas()
