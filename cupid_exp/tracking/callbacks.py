"""Hydra callbacks: secrets out of Hydra's files, an MLflow parent per sweep, the sweep's failure report."""

from __future__ import annotations

import atexit
import json
import logging
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from cupid_exp.config import TrackingConfig
from cupid_exp.durability.signals import Terminated, install_sigterm_handler
from cupid_exp.secrets import install_log_scrubber, scrub, scrub_file, secret_values, url_credentials
from cupid_exp.tracking.mlflow import ensure_parent, parent_run_id
from cupid_exp.tracking.store_errors import STORE_NOTE, store_unreachable

if TYPE_CHECKING:
    from hydra.core.utils import JobReturn

log = logging.getLogger(__name__)


class RedactSecretsCallback(Callback):
    """Mask secrets in the config and overrides Hydra saves (and ``multirun.yaml``) and prints."""

    def on_job_start(self, config: DictConfig, **kwargs: object) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        # the overrides' and composed config's, unresolved (so broken interpolations still mask)
        secrets = secret_values([*hc.overrides.task, OmegaConf.to_container(config, resolve=False)])
        if not secrets:
            return
        if hc.output_subdir is not None:
            saved = Path(hc.runtime.output_dir) / hc.output_subdir
            for name in ("config.yaml", "overrides.yaml", "hydra.yaml"):
                scrub_file(saved / name, secrets)
        if hc.mode == RunMode.MULTIRUN:  # written by the sweeper after on_multirun_start
            scrub_file(Path(hc.sweep.dir) / "multirun.yaml", secrets)

    def on_job_end(self, config: DictConfig, job_return: JobReturn | None = None, **kwargs: object) -> None:
        # Hydra writes "Error executing job with overrides: [...]" to stderr for a failed job
        overrides = getattr(job_return, "overrides", None)
        if overrides:
            secrets = secret_values(list(overrides))
            job_return.overrides = [scrub(o, secrets) for o in overrides]

    def on_multirun_start(self, config: DictConfig, **kwargs: object) -> None:
        # the launcher logs every job's overrides ("#0 : model=... +x.api_key=...") before any job runs
        install_log_scrubber(secret_values(list(config.hydra.overrides.task)))

    def on_multirun_end(self, config: DictConfig, **kwargs: object) -> None:
        secrets = secret_values(list(config.hydra.overrides.task))
        if secrets:
            scrub_file(Path(config.hydra.sweep.dir) / "multirun.yaml", secrets)


class MlflowSweepCallback(Callback):
    """Opens a multirun's parent run and closes it at the end with the sweep's leaderboard (FAILED if a job failed;
    KILLED on Ctrl-C or SIGTERM). Both ends are the run worker's when there is one."""

    def __init__(self) -> None:
        self._open: tuple[str, str] | None = None  # (tracking uri, sweep folder) while the sweep runs

    def on_multirun_start(self, config: DictConfig, **kwargs: object) -> None:
        if not config.tracking.enabled or config.calls.dry_run or url_credentials(config.tracking.uri):
            return  # a sweep gets a parent run with tracking on, no dry run, and a URI without credentials
        from cupid_exp.tracking import run_worker

        sweep_dir = Path(config.hydra.sweep.dir).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        node = OmegaConf.to_object(config.tracking)  # as its dataclass: plain data for the run worker
        tracking = node if isinstance(node, TrackingConfig) else TrackingConfig(**node)
        worker = run_worker.start(keep=True)
        overrides = list(OmegaConf.select(config, "hydra.overrides.task", default=None) or [])
        if worker is not None:
            worker.open_sweep(tracking, str(sweep_dir), overrides)
        else:
            ensure_parent(tracking, sweep_dir, overrides)
        self._open = (tracking.uri, str(sweep_dir))
        # MLflow's import at exit (a joblib sweep's launcher has not imported it) needs this module: imported after
        # threading's shutdown, it cannot register its exit hook and raises
        import concurrent.futures.thread  # noqa: F401

        atexit.register(self._killed_at_exit)
        install_sigterm_handler()

    def _killed_at_exit(self) -> None:
        """The process exits with the sweep still open: KILLED after an interrupt, FAILED after a crash."""
        if self._open is not None:
            uri, sweep_dir = self._open
            self._open = None
            parent = parent_run_id(sweep_dir)
            if parent is None:
                return
            from mlflow.tracking import MlflowClient

            crash = getattr(sys, "last_value", None)
            interrupted = crash is None or isinstance(crash, (KeyboardInterrupt, Terminated))
            with _store_gone_said():
                MlflowClient(uri).set_terminated(parent, status="KILLED" if interrupted else "FAILED")

    def on_multirun_end(self, config: DictConfig, **kwargs: object) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if config.calls.dry_run:
            print(sweep_dry_run_total(sweep_dir))
        if not config.tracking.enabled or url_credentials(config.tracking.uri):  # each job refused the URI
            return
        from cupid_exp.tracking import run_worker
        from cupid_exp.tracking.sweep import SweepEnd, finish_sweep

        end = SweepEnd(uri=config.tracking.uri, experiment=config.tracking.experiment,
                       sweep_dir=str(sweep_dir.resolve()), seed=int(config.get("seed", 0) or 0),
                       failed=any(s.get("outcome") == "error" for s in job_statuses(sweep_dir)))
        worker = run_worker.take_idle()
        problem = None
        with _store_gone_said():
            done, problem = worker.close_sweep(end) if worker is not None else (False, None)
            if not done:
                problem = finish_sweep(end)
        if problem:
            log.warning("sweep leaderboard not logged on the parent run: %s", problem)
        self._open = None


@contextmanager
def _store_gone_said() -> Iterator[None]:
    """Around ending the sweep's parent run: a dead store (each job said so in its line, exit 5) leaves it RUNNING,
    with one note; any other error goes on."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001
        if not store_unreachable(exc):
            raise
        log.warning("the sweep's parent run could not be ended: %s", type(exc).__name__, extra=STORE_NOTE)


STATUS_FILE = "job_status.json"


def job_statuses(sweep_dir: Path) -> list[dict[str, Any]]:
    """What each job of a sweep wrote about how it ended (see ``job.entry``), in the jobs' order (#2 before #10)."""
    def job_number(path: Path) -> tuple[int, str]:
        head = path.parent.name.split("_", 1)[0]
        return (int(head) if head.isdigit() else -1, path.parent.name)

    out = []
    for path in sorted(sweep_dir.glob(f"*/{STATUS_FILE}"), key=job_number):
        try:
            out.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            out.append({"job": path.parent.name, "outcome": "error", "reason": f"unreadable {path.name}"})
    return out


def reason_reported(sweep_dir: Path, reason: str) -> bool:
    """Whether an earlier job of the sweep was refused for ``reason`` (and said so): a sweep says a reason once."""
    return any(s.get("outcome") == "error" and s.get("reason") == reason for s in job_statuses(sweep_dir))


def sweep_dry_run_total(sweep_dir: Path) -> str:
    """Sum a sweep's dry-run estimates; with none, say so (not an estimate of $0)."""
    statuses = job_statuses(sweep_dir)
    refused = sum(s.get("outcome") == "error" for s in statuses)
    # each estimated job's metrics.json, in its folder (its experiment's, or one in the sweep's: ``entry._sweep_job``)
    folders = [Path(s.get("folder") or sweep_dir / str(s.get("job"))) for s in statuses if s.get("outcome") != "error"]
    estimates = [json.loads(p.read_text()).get("metrics", {}) for p in (f / "metrics.json" for f in folders)
                 if p.is_file()]
    if not estimates:
        return (f"DRY RUN: no job of the sweep was estimated ({refused} of {len(statuses)} refused before planning "
                f"its calls: see why above); no sweep total")

    def total(key: str) -> float:
        return sum(m.get(key, 0.0) for m in estimates)

    cost, batch = total("cost/usd"), total("cost/usd_at_batch_prices")
    return (f"DRY RUN sweep total over {len(estimates)} jobs"
            + (f" ({refused} refused, not counted)" if refused else "")
            + f": {int(total('calls/total'))} calls, {int(total('tokens/prompt'))} prompt tokens, "
            f"~{int(total('tokens/completion'))} completion tokens, ~${cost:.4f}"
            + (f"; with calls.batch=true ~${batch:.4f} (Batch API prices where the provider has them)"
               if 0 < batch < cost else ""))
