"""The schemas registered in Hydra's ConfigStore, at the entry: registering imports every setting module."""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cupid_exp.config import RunConfig


def register_configs() -> None:
    """Register the entry schema, every setting's schema (group ``setting``) and the folder names' resolvers (Hydra
    carries resolvers to a launcher's processes)."""
    from cupid_exp.outputs import folder_name
    from cupid_exp.settings import register_setting_schemas

    for name, resolver in (("folder_name", folder_name), ("experiment_fingerprint", experiment_fingerprint),
                           ("sweep_job_folder", sweep_job_folder)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
    ConfigStore.instance().store(name="run_schema", node=RunConfig)
    register_setting_schemas()


def experiment_fingerprint(*, _root_: DictConfig) -> str:
    """``${experiment_fingerprint:}``: the job folder's name; a config that does not resolve enters as written."""
    from cupid_exp.identity import folder_fingerprint

    try:
        resolved = {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                    for k, v in _root_.items() if k != "hydra"}
    except OmegaConfBaseException:
        resolved = {k: v for k, v in OmegaConf.to_container(_root_, resolve=False).items() if k != "hydra"}
    return folder_fingerprint(resolved)


def sweep_job_folder(num: int, name: str, *, _root_: DictConfig) -> str:
    """``hydra.sweep.subdir``: a sweep job's folder is the one a single run of it has (absolute, outside the sweep's
    folder), unless ``hydra.sweep.dir`` is set elsewhere (then ``<num>_<name>`` inside it)."""
    root = Path(str(_root_.paths.output_root)).expanduser().resolve()
    sweep = Path(str(_root_.hydra.sweep.dir)).expanduser().resolve()
    if not sweep.is_relative_to(root / "multirun"):
        return f"{num}_{name}"
    return str(root / "runs" / name / experiment_fingerprint(_root_=_root_))
