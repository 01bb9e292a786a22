"""The two sides of a config diff (composed from, resolved to), read from a job folder or an MLflow run."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml
from omegaconf import DictConfig, OmegaConf

from cupid_exp.reporting.runs import is_run_id_prefix, resolve_run_id
from cupid_exp.secrets import redact

DIGESTS = ("prompts_digest", "dataset_digest", "git_commit")
ABSENT = object()  # what ``RunSpec.select`` gives for a key the record does not have


@dataclass
class RunSpec:
    """One side of a diff: what a run was composed from and what it resolved to."""

    label: str
    config: dict[str, Any]  # resolved (where resolvable), secrets redacted, no 'hydra' key
    choices: dict[str, str]  # config group -> option (Hydra's runtime.choices), hydra/* left out
    overrides: list[str] | None  # the task overrides it was launched with; None when unknown
    digests: dict[str, str] = field(default_factory=dict)

    @functools.cached_property
    def _tree(self) -> DictConfig:
        return OmegaConf.create(self.config)

    def select(self, key: str) -> object:
        """The recorded value at dotted ``key`` as plain data; ``ABSENT`` when the record lacks it."""
        value = OmegaConf.select(self._tree, key, default=ABSENT, throw_on_resolution_failure=False)
        return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def job_choices(raw: Mapping[str, Any] | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (raw or {}).items() if v is not None and not str(k).startswith("hydra/")}


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """Resolve interpolations where possible; a top-level node that cannot be resolved stays as written."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:
        raw = OmegaConf.to_container(cfg, resolve=False)
        out = {}
        for key in cfg:
            try:
                node = cfg[key]
                out[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
            except Exception:
                out[key] = raw[key]
        return out


def _read_overrides(path: Path) -> list[str] | None:
    return [str(o) for o in (yaml.safe_load(path.read_text()) or [])] if path.exists() else None


def spec_from_job_dir(path: str | Path) -> RunSpec:
    """A Hydra job output dir: .hydra/config.yaml, .hydra/hydra.yaml, .hydra/overrides.yaml (+ metrics.json)."""
    path = Path(path)
    hydra_dir = path / ".hydra"
    if not (hydra_dir / "config.yaml").exists():
        raise FileNotFoundError(f"{path} is not a Hydra job dir (no .hydra/config.yaml)")
    cfg = OmegaConf.load(hydra_dir / "config.yaml")
    config = redact({k: v for k, v in resolved(cfg).items() if k != "hydra"})
    choices: dict[str, str] = {}
    if (hydra_dir / "hydra.yaml").exists():
        raw = OmegaConf.select(OmegaConf.load(hydra_dir / "hydra.yaml"), "hydra.runtime.choices")
        choices = job_choices(OmegaConf.to_container(raw) if raw is not None else None)
    digests = {}
    metrics = path / "metrics.json"
    if metrics.exists():
        summary = json.loads(metrics.read_text())
        git = summary.get("git") or {}  # provenance.git_state(): git_commit, git_dirty
        digests = {"prompts_digest": summary.get("prompts_digest"),
                   "dataset_digest": (summary.get("data") or {}).get("digest"),
                   "git_commit": summary.get("git_commit") or git.get("git_commit") or git.get("commit")}
        digests = {k: str(v) for k, v in digests.items() if v}
        if git.get("git_dirty") == "true" and "git_commit" in digests:  # as an MLflow run's tags say it
            digests["git_commit"] += " (dirty)"
    return RunSpec(f"job dir {path}", config, choices, _read_overrides(hydra_dir / "overrides.yaml"), digests)


def spec_from_mlflow(run_id: str, tracking_uri: str) -> RunSpec:
    """An MLflow job run: the config.yaml artifact, params choice.<group>, tags for the digests."""
    import mlflow.artifacts
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    run = MlflowClient(tracking_uri).get_run(run_id)
    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="config.yaml", dst_path=tmp,
                                                    tracking_uri=tracking_uri)
        config = yaml.safe_load(Path(local).read_text(encoding="utf-8")) or {}
    # the tracker writes 'choice.' + the group with characters outside [\w.\-/: ] (the '@') turned into ':'
    choices = job_choices({k.removeprefix("choice.").replace(":", "@"): v
                           for k, v in run.data.params.items() if k.startswith("choice.")})
    out_dir = run.data.tags.get("output_dir")
    overrides = _read_overrides(Path(out_dir) / ".hydra" / "overrides.yaml") if out_dir else None
    digests = {k: run.data.tags[k] for k in DIGESTS if run.data.tags.get(k)}
    if run.data.tags.get("git_dirty") == "true" and "git_commit" in digests:
        digests["git_commit"] += " (dirty)"
    return RunSpec(f"MLflow run {run_id}", redact(config), choices, overrides, digests)


def load_spec(ref: str, tracking_uri: str) -> RunSpec:
    """A job output dir, or an MLflow run by its id or the start of it when unique (RunIdError otherwise)."""
    if Path(ref).is_dir():
        return spec_from_job_dir(ref)
    if is_run_id_prefix(ref):
        return spec_from_mlflow(resolve_run_id(tracking_uri, ref), tracking_uri)
    raise ValueError(f"{ref!r} is neither a job output dir nor an MLflow run id (or the start of one: hex digits)")
