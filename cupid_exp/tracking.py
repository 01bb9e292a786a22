"""MLflow logging: one run per job, nested under one parent run per Hydra multirun.

The parent is created once on the launching process (``MlflowSweepCallback``) and its id
is written into the sweep directory, so jobs in other processes (joblib, submitit) find
it without sharing memory. Keys are never logged: config values under secret-looking
names are redacted before they reach params, artifacts or the saved config.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import subprocess
from pathlib import Path
from typing import Any, Iterator, Mapping

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from cupid_exp.secrets import install_log_scrubber, redact, scrub, scrub_file, secret_values

log = logging.getLogger(__name__)

PARENT_RUN_FILE = "mlflow_parent_run_id"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """{'a': {'b': 1}} -> {'a.b': '1'}; lists become JSON strings."""
    out: dict[str, str] = {}
    if isinstance(value, Mapping):
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        text = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
        out[prefix.rstrip(".")] = text[:6000]
    return out


def git_state() -> dict[str, str]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": "unknown", "git_dirty": "unknown"}
    return {"git_commit": commit or "unknown", "git_dirty": str(dirty).lower()}


def _experiment_id(tracking: DictConfig) -> str:
    import mlflow

    mlflow.set_tracking_uri(tracking.uri)
    experiment = mlflow.get_experiment_by_name(tracking.experiment)
    if experiment is not None:
        return experiment.experiment_id
    location = None
    if tracking.artifact_location:
        location = Path(tracking.artifact_location).expanduser().resolve().as_uri()
    try:
        return mlflow.create_experiment(tracking.experiment, artifact_location=location)
    except Exception:  # another job created it first
        return mlflow.get_experiment_by_name(tracking.experiment).experiment_id


_READY_STORES: set[str] = set()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock across processes (a no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _prepare_store(tracking: DictConfig) -> None:
    """Create a SQLite store's folder and schema. Parallel jobs on a fresh store would each run MLflow's
    schema migrations at once and fail ('table ... already exists'); a file lock lets one do it."""
    if not tracking.uri.startswith("sqlite:///") or tracking.uri in _READY_STORES:
        return
    db = Path(tracking.uri.removeprefix("sqlite:///")).expanduser()
    db.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(db.with_name(db.name + ".lock")):
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking.uri).search_experiments(max_results=1)  # creates or migrates the schema
    _READY_STORES.add(tracking.uri)


class RedactSecretsCallback(Callback):
    """Hydra saves the config and overrides before the job starts (and a sweep's overrides in
    ``multirun.yaml``), and prints a failed job's overrides; mask any secret in them."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        secrets = secret_values(list(hc.overrides.task))
        if not secrets:
            return
        if hc.output_subdir is not None:
            saved = Path(hc.runtime.output_dir) / hc.output_subdir
            for name in ("config.yaml", "overrides.yaml", "hydra.yaml"):
                scrub_file(saved / name, secrets)
        if hc.mode == RunMode.MULTIRUN:  # written by the sweeper after on_multirun_start
            scrub_file(Path(hc.sweep.dir) / "multirun.yaml", secrets)

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        # Hydra writes "Error executing job with overrides: [...]" to stderr for a failed job
        overrides = getattr(job_return, "overrides", None)
        if overrides:
            secrets = secret_values(list(overrides))
            job_return.overrides = [scrub(o, secrets) for o in overrides]

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # the launcher logs every job's overrides ("#0 : model=... +x.api_key=...") before any job runs
        install_log_scrubber(secret_values(list(config.hydra.overrides.task)))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        secrets = secret_values(list(config.hydra.overrides.task))
        if secrets:
            scrub_file(Path(config.hydra.sweep.dir) / "multirun.yaml", secrets)


class MlflowSweepCallback(Callback):
    """Opens the parent run of a multirun and closes it when the sweep ends."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not config.tracking.enabled or config.runtime.dry_run:
            return
        from mlflow.tracking import MlflowClient

        _prepare_store(config.tracking)
        experiment_id = _experiment_id(config.tracking)
        sweep_dir = Path(config.hydra.sweep.dir)
        run = MlflowClient(config.tracking.uri).create_run(
            experiment_id, run_name=f"sweep {sweep_dir.name}",
            tags={"cupid.kind": "sweep", "cupid.sweep_dir": str(sweep_dir.resolve()), **git_state()})
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / PARENT_RUN_FILE).write_text(run.info.run_id)
        log.info("MLflow parent run %s for sweep %s", run.info.run_id, sweep_dir)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if config.runtime.dry_run:
            print(_sweep_dry_run_total(Path(config.hydra.sweep.dir)))
        if not config.tracking.enabled:
            return
        from mlflow.tracking import MlflowClient

        marker = Path(config.hydra.sweep.dir) / PARENT_RUN_FILE
        if marker.exists():
            MlflowClient(config.tracking.uri).set_terminated(marker.read_text().strip())


def parent_run_id(sweep_dir: str | Path | None) -> str | None:
    if not sweep_dir:
        return None
    marker = Path(sweep_dir) / PARENT_RUN_FILE
    return marker.read_text().strip() if marker.exists() else None


def log_job(cfg: DictConfig, *, run_name: str, choices: Mapping[str, str], tags: Mapping[str, str],
            metrics: Mapping[str, float], table: Any, artifacts: list[Path], parent: str | None,
            artifact_dirs: Mapping[str, list[Path]] | None = None) -> str:
    """Log one job as an MLflow run; returns its run id. ``artifact_dirs`` maps an artifact
    folder (e.g. 'plots', '.hydra') to the files logged under it."""
    import mlflow

    _prepare_store(cfg.tracking)
    experiment_id = _experiment_id(cfg.tracking)
    resolved = redact({k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
                       for k in cfg if k != "hydra"})
    secrets = secret_values(resolved)
    params = {k: scrub(v, secrets) for k, v in flatten(resolved).items()}
    params.update({"choice." + re.sub(r"[^\w.\-/: ]", ":", k): str(v) for k, v in choices.items()})
    all_tags = {k: scrub(str(v), secrets) for k, v in {**git_state(), **tags, "cupid.kind": "job"}.items()}
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name, parent_run_id=parent,
                          tags=all_tags) as run:
        mlflow.log_params(params)
        mlflow.log_metrics({k: v for k, v in metrics.items() if v == v})  # NaN-free
        mlflow.log_dict(resolved, "config.yaml")
        for path in artifacts:
            if path.exists():
                mlflow.log_artifact(str(path))
        for folder, paths in (artifact_dirs or {}).items():
            for path in paths:
                if path.exists():
                    mlflow.log_artifact(str(path), artifact_path=folder)
        if table is not None and len(table):
            mlflow.log_table(table, artifact_file="instances_table.json")
        return run.info.run_id


def _sweep_dry_run_total(sweep_dir: Path) -> str:
    """Sum the dry-run estimates of every job of a sweep."""
    calls = tokens = completion = cost = 0.0
    jobs = 0
    for path in sorted(sweep_dir.glob("*/metrics.json")):
        metrics = json.loads(path.read_text()).get("metrics", {})
        jobs += 1
        calls += metrics.get("calls/total", 0.0)
        tokens += metrics.get("tokens/prompt", 0.0)
        completion += metrics.get("tokens/completion", 0.0)
        cost += metrics.get("cost/usd", 0.0)
    return (f"DRY RUN sweep total over {jobs} jobs: {int(calls)} calls, {int(tokens)} prompt tokens, "
            f"~{int(completion)} completion tokens, ~${cost:.4f}")
