"""The config schemas registered in Hydra's ConfigStore, done where a Hydra entry starts.

Registering needs every setting module (each carries its own schema, ``cupid_exp.settings``), so it lives here, at
the entry, and not in ``cupid_exp.config``: importing the schema then imports nothing above it. Called by
``entry.hydra_entry`` and by what composes configs without an entry (``reporting.diff_compose``, the tests).
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from cupid_exp.config import RunConfig


def register_configs() -> None:
    """Register the entry schema, every setting's schema (group ``setting``) and the folder names' resolvers."""
    from omegaconf import OmegaConf

    from cupid_exp.outputs import register_resolvers
    from cupid_exp.settings import register_setting_schemas

    register_resolvers()
    for name, resolver in (("experiment_fingerprint", experiment_fingerprint), ("sweep_job_folder", sweep_job_folder)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
    ConfigStore.instance().store(name="run_schema", node=RunConfig)
    register_setting_schemas()


def experiment_fingerprint(*, _root_: DictConfig) -> str:
    """``${experiment_fingerprint:}``: the folder name of the job the composed config describes
    (``identity.folder_fingerprint``). A config that does not resolve enters as written: the job says what is wrong."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from cupid_exp.identity import folder_fingerprint

    try:
        resolved = {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                    for k, v in _root_.items() if k != "hydra"}
    except OmegaConfBaseException:
        resolved = {k: v for k, v in OmegaConf.to_container(_root_, resolve=False).items() if k != "hydra"}
    return folder_fingerprint(resolved)


def sweep_job_folder(num: int, name: str, *, _root_: DictConfig) -> str:
    """``hydra.sweep.subdir``: a sweep job's folder is its experiment's, the one a single run of it has
    (``<output_root>/runs/<name>/<fingerprint>``; absolute, so Hydra puts it there, outside the sweep's folder),
    while the sweep's folder is under ``<output_root>/multirun``; a ``hydra.sweep.dir`` set elsewhere keeps its jobs
    inside it (``<num>_<name>``)."""
    root = Path(str(_root_.paths.output_root)).expanduser().resolve()
    sweep = Path(str(_root_.hydra.sweep.dir)).expanduser().resolve()
    if not sweep.is_relative_to(root / "multirun"):
        return f"{num}_{name}"
    return str(root / "runs" / name / experiment_fingerprint(_root_=_root_))
