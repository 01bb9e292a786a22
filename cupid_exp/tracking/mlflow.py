"""MLflow: one run per job, named to tell it apart, closed with its outcome; one parent per sweep, named in the sweep
folder; a SQLite store made aside and renamed into place, since MLflow's migrations are not transactional."""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import time
import uuid
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

from filelock import FileLock

from cupid_exp.aside import set_aside
from cupid_exp.config import TrackingConfig
from cupid_exp.data.schema import INSTANCE_TYPES
from cupid_exp.durability.signals import shielded, sigterm_raises
from cupid_exp.errors import first_line
from cupid_exp.outputs import atomic_write_text
from cupid_exp.resources import git_state
from cupid_exp.run_outcomes import outcome_of, outcome_tags, stale_tags, status_of
from cupid_exp.secrets import is_headers_key, is_secret_key, mask_url_credentials, scrub, scrub_obj, secret_values
from cupid_exp.tracking import store_errors

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.entities import Dataset

log = logging.getLogger(__name__)

PARENT_RUN_FILE = "mlflow_parent_run_id"
_RUN_ID = re.compile(r"[0-9a-f]{32}")  #: an MLflow run id, as the marker holds it
_READY_STORES: set[str] = set()


SEP = " · "
SCORES_SEP = " | "  #: between a job run's identity and its results in its name


def override_pairs(overrides: Iterable[str]) -> list[tuple[str, str]]:
    """(key, value) of each ``key=value`` override, its ``+``/``++``/``~`` prefix dropped."""
    return [(key.lstrip("+~"), value) for key, sep, value in (str(text).partition("=") for text in overrides) if sep]


def scoring_overrides(overrides: Iterable[str]) -> list[str]:
    """The command's decoding and prompt overrides, as a row label names them (``temperature=0.4``)."""
    from cupid_exp.identity import short_key  # (it imports the model layer: not where a sweep starts)

    shown = []
    for key, value in override_pairs(overrides):
        path = key.split(".")
        if any(is_secret_key(part) or is_headers_key(part) for part in path):
            continue  # a key or a header (``model.params.extra_headers.x-api-key``) never enters a name
        value = mask_url_credentials(value)
        root = path[0]
        if root == "prompts" or (root in ("model", "evaluator") and any(p.endswith("params") for p in path[1:-1])):
            shown.append(f"{short_key(key)}={value}")
    return shown


def subset_of(limit: int | None, types: Sequence[str] | None) -> str:
    """'data.limit=2' for a part of the data; empty for all."""
    from cupid_exp.identity import subset_text

    kept = tuple(sorted(set(types or ()))) if types and not set(types) >= set(INSTANCE_TYPES) else ()
    return subset_text(limit if limit else None, kept)


def job_run_name(model: str, task: str, setting: str, evaluator: str, data: str, subset: str = "",
                 overrides: Iterable[str] = (), epochs: int = 1) -> str:
    """'gpt4o · inference · standard · eval gpt4o · sample [data.limit=2] · temperature=0.4 · 3 epochs'."""
    parts = [model, task, setting, f"eval {evaluator}", f"{data} [{subset}]" if subset else data,
             *scoring_overrides(overrides)]
    if epochs and int(epochs) > 1:
        parts.append(f"{int(epochs)} epochs")
    return SEP.join(parts)


def hydra_overrides() -> list[str]:
    """This Hydra job's command-line overrides (none outside a Hydra app: tests, notebooks)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except (ImportError, ValueError):
        return []


def headline(metrics: Mapping[str, float], done: int, total: int, unit: str) -> str:
    """'inference f1 0.620 · $0.0123 · 3 of 3 instances'."""
    from cupid_exp.scoring.names import metric_key
    from cupid_exp.scoring.statistics import HEADLINE

    parts = [f"{task} {name} {metrics[key]:.3f}" for task, name in HEADLINE.items()
             if (key := metric_key(task, "all", name)) in metrics and metrics[key] == metrics[key]]
    return SEP.join([*parts, f"${metrics.get('cost/usd', 0.0):.4f}", f"{done} of {total} {unit}"])


def scored_name(name: str, line: str) -> str:
    """The run's name with its results after it (a resumed run's earlier results replaced)."""
    return f"{name.split(SCORES_SEP)[0]}{SCORES_SEP}{line}"


def link_name(name: str, run_id: str) -> str:
    """A sweep's link child: says it is a link, and to which run."""
    return f"link → {run_id[:8]}{SEP}{name.split(SCORES_SEP)[0]}"


def flatten(value: object, prefix: str = "") -> dict[str, str]:
    """{'a': {'b': 1}} -> {'a.b': '1'}; lists become JSON strings; values cut at MLflow's 6000 characters."""
    out: dict[str, str] = {}
    if isinstance(value, Mapping):
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        text = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
        out[prefix.rstrip(".")] = text[:6000]
    return out


ASIDE_SUFFIX = ".creating"  #: a store being made: ``.<name>.<pid>-<random>.creating`` beside it


def clear_leftovers(db: Path) -> None:
    """Remove stores a killed process was making (the lock is held: nobody else is making one now)."""
    for path in db.parent.glob(f".{db.name}.*{ASIDE_SUFFIX}*"):  # its -journal too
        path.unlink(missing_ok=True)


def create_aside(db: Path) -> None:
    """Make a new store (MLflow's own schema, its Default experiment) beside ``db``, then move it into place."""
    from mlflow.tracking import MlflowClient

    aside = db.with_name(f".{db.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}{ASIDE_SUFFIX}")
    try:
        MlflowClient(f"sqlite:///{aside}").search_experiments(max_results=1)  # creates and migrates the schema
        forget_connections(f"sqlite:///{aside}")
        os.replace(aside, db)
    finally:
        clear_leftovers(db)


def forget_connections(uri: str) -> None:
    """Close MLflow's pooled connections to ``uri``'s file: they would outlive its rename."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    engine = getattr(SqlAlchemyStore, "_engine_map", {}).pop(uri, None)
    if engine is not None:
        engine.dispose()


def holds_nothing(db: Path) -> bool:
    """No run and no experiment but Default in it: nothing lost by remaking it."""
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as con:
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "runs" in tables and con.execute("SELECT 1 FROM runs LIMIT 1").fetchone():
                return False
            return not ("experiments" in tables and con.execute(
                "SELECT 1 FROM experiments WHERE experiment_id != 0 LIMIT 1").fetchone())
    except sqlite3.Error:
        return False  # not a database we can read: not ours to replace


def unreadable(db: Path) -> sqlite3.DatabaseError | None:
    """SQLite's error when ``db`` is no database at all; else None (locks, permissions: not the file)."""
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as con:
            con.execute("SELECT name FROM sqlite_master").fetchall()
    except sqlite3.DatabaseError as exc:
        return None if isinstance(exc, sqlite3.OperationalError) else exc
    return None


def repair(db: Path, error: BaseException) -> bool:
    """Remake a store MLflow could not open when unreadable or empty (True); else leave it (False)."""
    if not db.exists():
        return False
    corrupt = unreadable(db)
    if corrupt is None and not holds_nothing(db):
        return False
    forget_connections(f"sqlite:///{db}")  # the failed open's: they would read the moved file on
    if corrupt is not None:
        set_aside(db, "MLflow store", corrupt, "a new store is made and this job's run starts in it (the runs the "
                  "old one held stay in the file set aside)", companions=("-wal", "-shm", "-journal"))
    else:
        broken = db.with_name(f"{db.name}.half-made-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(db, broken)
        first = first_line(error)
        log.warning("MLflow store %s was half made (%s: %s) and held no run: moved to %s and made again", db,
                    type(error).__name__, first, broken.name)
    create_aside(db)
    return True


def prepare_store(uri: str) -> None:
    """Make sure a SQLite store exists whole, once per process, under a file lock: MLflow's migrations are neither
    concurrent-safe nor transactional, so a store is made aside and moved in whole, and a half-made one is remade."""
    if not uri.startswith("sqlite:///") or uri in _READY_STORES:
        return
    from mlflow.tracking import MlflowClient

    db = Path(uri.removeprefix("sqlite:///")).expanduser()
    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(db.with_name(db.name + ".lock"))):
        clear_leftovers(db)
        if not db.exists():
            create_aside(db)
        try:
            MlflowClient(uri).search_experiments(max_results=1)  # opens it (migrates one made by an older MLflow)
        except Exception as exc:  # noqa: BLE001 - repaired if it holds nothing, else raised as it is
            if not repair(db, exc):
                raise
            MlflowClient(uri).search_experiments(max_results=1)
    _READY_STORES.add(uri)


def artifact_location(tracking: TrackingConfig) -> str | None:
    """Where a new experiment keeps artifacts: as configured, beside a SQLite file, else the server's."""
    where = tracking.artifact_location
    if where:
        return where if re.match(r"^[a-zA-Z][\w+.-]*:/", where) else Path(where).expanduser().resolve().as_uri()
    if tracking.uri.startswith("sqlite:///"):
        db = Path(tracking.uri.removeprefix("sqlite:///")).expanduser()
        return db.parent.resolve().joinpath("mlartifacts").as_uri()
    return None


def experiment_id(tracking: TrackingConfig) -> str:
    """The experiment's id, created on first use (see ``artifact_location``)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking.uri)
    found = client.get_experiment_by_name(tracking.experiment)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(tracking.experiment, artifact_location=artifact_location(tracking))
    except MlflowException:  # another job created it first
        return client.get_experiment_by_name(tracking.experiment).experiment_id


def parent_run_id(sweep_dir: str | Path | None) -> str | None:
    """The run id the sweep folder's marker names; None without a valid one."""
    if not sweep_dir:
        return None
    try:
        found = (Path(sweep_dir) / PARENT_RUN_FILE).read_bytes().strip().decode("ascii")
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return found if _RUN_ID.fullmatch(found) else None


@dataclass(frozen=True)
class SweepParent:
    """A sweep's parent run named by its folder before it exists; the run worker opens it."""

    sweep_dir: str


def ensure_parent(tracking: TrackingConfig, sweep_dir: str | Path, overrides: Iterable[str] = ()) -> str:
    """The sweep's parent run id: the marker's, else a new run (under a lock) with ``sweep.*`` params."""
    folder = Path(sweep_dir)
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / f".{PARENT_RUN_FILE}.lock")):
        found = parent_run_id(folder)
        if found:
            return found
        marker = folder / PARENT_RUN_FILE
        if marker.exists():  # not a run id: a marker written over
            set_aside(marker, "sweep parent marker", "not a run id", "a new parent run is made for this sweep")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        prepare_store(tracking.uri)
        hidden = secret_values(list(overrides))
        swept = {_clean_key(f"sweep.{k}"): scrub(v, hidden)[:6000] for k, v in override_pairs(overrides)}
        varied = [f"{k.removeprefix('sweep.')}={v}" for k, v in swept.items() if "," in v and v[:1] not in "[{"]
        client = MlflowClient(tracking.uri)
        run = client.create_run(
            experiment_id(tracking), run_name=SEP.join([f"sweep {folder.name}", *varied]),
            tags={"cupid.kind": "sweep", "cupid.sweep_dir": str(folder.resolve()), **git_state()})
        client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in swept.items()])  # (none: no request)
        atomic_write_text(folder / PARENT_RUN_FILE, run.info.run_id)
        log.info("MLflow parent run %s for sweep %s", run.info.run_id, folder)
        return run.info.run_id


def parent_of(tracking: TrackingConfig, parent: str | SweepParent | None) -> str | None:
    """A job's parent run id (a sweep's parent is opened here if nobody has yet)."""
    return ensure_parent(tracking, parent.sweep_dir) if isinstance(parent, SweepParent) else parent


def records_table(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Per-instance rows for MLflow's table view: scalars as they are, containers as JSON text."""
    import pandas as pd

    frame = pd.DataFrame([{k: v for k, v in r.items() if k != "raw"} for r in records])
    return frame.apply(lambda col: col.map(
        lambda v: json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v))


def _clean_key(key: str) -> str:
    return re.sub(r"[^\w.\-/: ]", ":", key)


class RunTracker:
    """The MLflow run of one job: params and tags at start, progress while it works, results at the end."""

    def __init__(self, tracking: TrackingConfig, secrets: Iterable[str] = ()):
        from mlflow.tracking import MlflowClient

        store_errors.install()  # a failing store is reported once by the job, not in thousands of lines by MLflow
        self.tracking, self.secrets = tracking, list(secrets)
        prepare_store(tracking.uri)
        self.client = MlflowClient(tracking.uri)
        self.experiment_id = experiment_id(tracking)
        self.run_id: str | None = None
        self.status: str | None = None  #: how the run ended (None while it runs)

    def start(self, *, run_name: str, params: Mapping[str, Any], tags: Mapping[str, str], parent: str | None,
              config: Mapping[str, Any], resume: str | None = None) -> str:
        """A new run, or ``resume``'s reopened; params are write-once, so only missing ones are added."""
        from mlflow.entities import Param

        all_tags = {**git_state(), **tags, "cupid.kind": "job"}
        if parent:
            all_tags["mlflow.parentRunId"] = parent
        if resume is None:
            run = self.client.create_run(self.experiment_id, run_name=run_name,
                                         tags={k: scrub(str(v), self.secrets) for k, v in all_tags.items()})
            self.run_id = run.info.run_id
        else:
            self.run_id = resume
            before = self.client.get_run(resume).data
            self.client.update_run(resume, status="RUNNING")
            for stale in stale_tags(before.tags):  # how the attempt before ended: this one decides anew
                self.client.delete_tag(resume, stale)
            self.set_tags(all_tags)
            params = {k: v for k, v in params.items() if _clean_key(k) not in before.params}
        self.client.log_batch(self.run_id, params=[Param(_clean_key(k), scrub(str(v), self.secrets)[:6000])
                                                   for k, v in params.items()])
        self.client.log_dict(self.run_id, scrub_obj(config, self.secrets), "config.yaml")
        return self.run_id

    # MlflowClient.log_batch sends batches of at most 100 params or tags, or 1000 metrics: one request each, not one
    # per value (and none for an empty list)
    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(_clean_key(k), float(v), now, step)
                                                    for k, v in metrics.items() if v == v])  # NaN-free

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, scrub(str(v), self.secrets)[:8000])
                                                 for k, v in tags.items()])

    def log_input(self, dataset: Dataset, context: str = "eval") -> None:
        """A dataset entity as the run's input: the runs table's Dataset column."""
        from mlflow.entities import DatasetInput, InputTag
        from mlflow.exceptions import MlflowException

        inputs = [DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)])]
        try:
            self.client.log_inputs(self.run_id, inputs)
        except MlflowException as exc:
            if "UNIQUE constraint failed: datasets" not in str(exc):
                raise
            # parallel jobs (joblib, submitit) logging the same data: another one stored the dataset between
            # MLflow's lookup and its insert; it exists now, and the retry links this run to it
            self.client.log_inputs(self.run_id, inputs)

    def log_artifacts(self, files: Iterable[Path], folder: str | None = None) -> None:
        for path in files:
            if path.exists():
                self.client.log_artifact(self.run_id, str(path), artifact_path=folder)

    def log_table(self, table: pd.DataFrame | None, name: str) -> None:
        if table is not None and len(table):
            self.client.log_table(self.run_id, data=table, artifact_file=name)

    def end(self, status: str = "FINISHED") -> None:
        """End the run once; later calls change nothing."""
        if self.run_id is not None and self.status is None:
            self.client.set_terminated(self.run_id, status=status)
            self.status = status


@contextmanager
def ends_on_error(run: Any) -> Iterator[None]:
    """Around a job's work: its run ends KILLED on Ctrl-C or SIGTERM, FAILED on any other exception (which goes on),
    with outcome tags; ending is shielded from interrupts."""
    with sigterm_raises():
        try:
            yield
        except BaseException as exc:
            if run is not None:
                outcome, reason = outcome_of(exc)
                with shielded():
                    try:
                        run.end(status_of(outcome), None, outcome_tags(outcome, reason))
                    except Exception as why:  # noqa: BLE001 - the job's own error is the one to report
                        log.warning("the MLflow run could not be ended %s (%s: %s); the next run of this command "
                                    "repairs it", status_of(outcome), type(why).__name__,
                                    first_line(why))
            raise
