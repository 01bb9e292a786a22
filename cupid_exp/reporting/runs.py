"""Finished job runs as the report reads them: MLflow queries and each run's records (cached). Labels come from the
setting's own ``label()``, identities from the job's own rule, so report and job agree."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from cupid_exp.errors import first_line
from cupid_exp.identity import content, short_key
from cupid_exp.reporting.data_identity import DIGEST_SHOWN, DataIdentity, data_identity
from cupid_exp.scoring.names import metric_key
from cupid_exp.scoring.statistics import HEADLINE, TASK_METRICS

if TYPE_CHECKING:
    from mlflow.entities import Run

    from cupid_exp.settings.base import Setting

DEFAULT_TRACKING_URI = "sqlite:///outputs/mlflow.db"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cupid-exp" / "report"


def tracking_uri(given: str | None) -> str:
    """``--tracking-uri`` if given, else ``MLFLOW_TRACKING_URI``, else the bare checkout's SQLite store."""
    return given or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


POINT_ELSEWHERE = "point it at your store with --tracking-uri URI or MLFLOW_TRACKING_URI=URI"


@contextmanager
def env_uri_kept() -> Iterator[None]:
    """Keep ``set_tracking_uri``'s export of ``MLFLOW_TRACKING_URI`` from leaking into later jobs or children."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        yield
    finally:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        if before is not None:
            os.environ["MLFLOW_TRACKING_URI"] = before


def existing_store(uri: str) -> None:
    """A LookupError when ``uri`` is a SQLite file that does not exist: MLflow would create an empty one on opening,
    so a read-only command says so in one line instead."""
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///")).expanduser()
        if not db.is_file():
            raise LookupError(f"no MLflow store at {uri} ({db.resolve()} does not exist): {POINT_ELSEWHERE}")


@functools.lru_cache(maxsize=None)
def _setting_class(name: str) -> type[Setting] | None:
    """The registered setting called ``name``; None for one this checkout does not have."""
    from cupid_exp.settings import SETTINGS, register_setting_schemas

    register_setting_schemas()  # imports every setting module, so SETTINGS is complete
    return SETTINGS.get(name)


def setting_label(params: Mapping[str, str]) -> str:
    """The setting's ``label()`` for the run's params, unrecorded ones at the schema's default."""
    name = params.get("setting.name") or "standard"
    cls = _setting_class(name)
    if cls is None:
        return name
    node = OmegaConf.structured(cls.Config)
    for f in dataclasses.fields(cls.Config):
        value = params.get(f"setting.{f.name}")
        if f.name != "name" and value not in (None, ""):
            with contextlib.suppress(ValidationError):  # a value the schema refuses stays at its default
                node[f.name] = value  # the schema turns "2" into 2
    return cls(OmegaConf.to_object(node)).label()


#: What a run's params hold that is no part of what its scores measure, beside what ``cupid_exp.identity`` leaves out:
#: the data (``JobRun.data_id`` stands for it: its content and the subset taken), the task (each task part is a
#: table of its own), the seed (it seeds the bootstrap), the prompts folder's path (its content digest stands
#: for it) and the group choices (their content is in the other params).
#: (``runtime.progress_every_s`` and ``calls.dry_run`` say how a job showed its progress and that it called
#: models: no published run differs in them; runs logged before ``calls`` was a group of its own say
#: ``runtime.dry_run``.)
REPORT_NOT_IDENTITY = ("data", "task", "seed", "prompts.dir", "runtime.progress_every_s", "calls.dry_run",
                       "runtime.dry_run")
PROMPTS_KEY = "prompts"  #: the prompts folder's content digest (tag ``prompts_digest``), as an identity key


def _plain(text: str) -> str | None:
    """A param's text as one spelling per value: None for null, '0' for 0.0, so that 0 and 0.0 are one value."""
    if text in ("None", "null", ""):
        return None
    try:
        number = float(text)
    except ValueError:
        return text
    if not math.isfinite(number) or not text.lstrip("+-").replace(".", "", 1).isdigit():
        return text  # inf, 1e-3, 1_000, ...: as written
    return str(int(number)) if number.is_integer() else repr(number)


def scored_identity(params: Mapping[str, str], tags: Mapping[str, str]) -> dict[str, str]:
    """Dotted key -> value of everything but the data that decides a run's scores, by ``cupid_exp.identity.content``."""
    nested: dict[str, Any] = {}
    for key, text in params.items():
        if key.startswith("choice.") or key.split(".")[0] in REPORT_NOT_IDENTITY or key in REPORT_NOT_IDENTITY:
            continue
        *parents, last = key.split(".")
        node: object = nested
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[last] = _plain(text)
    import pandas as pd

    # the params' dotted keys again (``tracking.mlflow.flatten`` made them): {'a': {'b': 1}} -> {'a.b': 1}
    dotted = pd.json_normalize(content(nested), sep=".").to_dict("records")[0]
    kept = {k: v for k, v in dotted.items() if v is not None}
    if tags.get("prompts_digest"):
        kept[PROMPTS_KEY] = tags["prompts_digest"]
    return dict(sorted(kept.items()))


def _shown(key: str, value: str | None) -> str:
    if value is None:
        return f"{short_key(key)}=unset"
    return f"{short_key(key)}={value[:DIGEST_SHOWN] if key == PROMPTS_KEY else value[:40]}"


def row_labels(runs: Sequence["JobRun"]) -> dict[str, str]:
    """run id -> row label: the model's name plus what sets it apart from its other runs here."""
    by_model: dict[str, list[JobRun]] = {}
    for run in runs:
        by_model.setdefault(run.model, []).append(run)
    labels = {}
    for model, group in by_model.items():
        keys = sorted({k for run in group for k in run.identity})

        def differ(key: str, among: Sequence[JobRun]) -> bool:
            return len({run.identity.get(key) for run in among}) > 1

        shared = [k for k in keys if not k.startswith("setting.") and k != EPOCHS_KEY and differ(k, group)]
        for run in group:
            same_setting = [r for r in group if r.setting_label == run.setting_label]
            own = [k for k in keys if k.startswith("setting.") and differ(k, same_setting)]
            parts = [_shown(k, run.identity.get(k)) for k in shared + own]
            if run.epochs > 1:  # always said: its numbers pool K draws of each instance
                parts.append(f"epochs={run.epochs}")
            labels[run.run_id] = " · ".join([model, ", ".join(parts)]) if parts else model
    return labels


#: ``runtime.epochs``: in the identity when above 1 (``cupid_exp.identity``); a row says ``epochs=K`` (``row_labels``)
EPOCHS_KEY = "runtime.epochs"
EPOCHS_NOTE = ("epochs=K rows: each instance ran K times; the intervals draw personas, then K of each drawn "
               "persona's epochs (a two-stage cluster bootstrap: both the instances drawn and the model's sampling)")


def identity_diff(a: Mapping[str, str], b: Mapping[str, str]) -> list[str]:
    """'model.params.temperature: 0 → 0.4' for each key whose value differs between two identities."""
    return [f"{k}: {a.get(k, 'unset')} → {b.get(k, 'unset')}" for k in sorted({*a, *b}) if a.get(k) != b.get(k)]


def _param(key: str, default: str = "?") -> property:
    return property(lambda run: run.param(key, default), doc=f"The run's ``{key}`` (``{default}`` if unset).")


@dataclass
class JobRun:
    """One finished job run as the report needs it."""

    run_id: str
    run_name: str
    status: str
    start_time: int  # ms since the epoch
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]

    @property
    def short(self) -> str:
        return self.run_id[:8]

    def param(self, key: str, default: str = "?") -> str:
        value = self.params.get(key)
        return default if value in (None, "") else value

    model = _param("model.name")
    setting = _param("setting.name", "standard")
    data = _param("data.name")
    evaluator = _param("evaluator.name")
    failure_policy = _param("runtime.failure_policy", "exclude")

    @property
    def epochs(self) -> int:
        """How many times the run ran each instance (``runtime.epochs``; 1 for a run from before epochs)."""
        try:
            return int(self.param(EPOCHS_KEY, "1"))
        except ValueError:
            return 1

    @functools.cached_property
    def setting_label(self) -> str:
        """``standard``, ``oracle``, ``retrieval[bm25,k=2]``, ``retrieval[embedding=<model>,k=2]``, ..."""
        return setting_label(self.params)

    @functools.cached_property
    def identity(self) -> dict[str, str]:
        return scored_identity(self.params, self.tags)

    @property
    def tasks(self) -> list[str]:
        """Task parts this run has numbers for, confirmed by its headline metrics."""
        recorded = self.params.get("task.parts")
        declared = json.loads(recorded) if recorded else [self.param("task.name", "")]
        found = [t for t in TASK_METRICS if metric_key(t, "all", HEADLINE[t]) in self.metrics]
        return [t for t in declared if t in found] or found

    def instances(self, task: str) -> float | None:
        return self.metrics.get(metric_key(task, "count", "instances"))

    @property
    def started(self) -> str:
        return datetime.fromtimestamp(self.start_time / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    @functools.cached_property
    def data_id(self) -> DataIdentity:
        """The data the run ran on: its content and the subset taken (``reporting.data_identity``)."""
        return data_identity(self.params, self.tags)

    @property
    def data_label(self) -> str:
        return self.data_id.label

    @property
    def subset(self) -> str:
        """'data.limit=1' when the run took a part of its data; empty when it ran on all of it."""
        return self.data_id.subset

    @property
    def complete(self) -> bool:
        """Whether the job said it completed (tag ``cupid.complete``; a run from before the tag counts as complete)."""
        return self.tags.get("cupid.complete", "true").lower() != "false"

    def describe(self) -> str:
        return f"{self.short} ({self.model}, {self.setting_label}, {', '.join(self.tasks) or self.param('task.name')})"


def _job_run(run: Run) -> JobRun:
    return JobRun(run_id=run.info.run_id, run_name=run.info.run_name or "", status=run.info.status,
                  start_time=run.info.start_time or 0, params=dict(run.data.params),
                  metrics=dict(run.data.metrics), tags=dict(run.data.tags))


def search_job_runs(uri: str, experiment: str, filter_string: str | None = None) -> list[JobRun]:
    """All job runs (any status) of ``experiment`` matching ``filter_string``; sweep parents are not jobs."""
    import mlflow
    from mlflow.tracking import MlflowClient

    existing_store(uri)
    with env_uri_kept():  # the report runs in-process in tests and notebooks: no exported URI for later jobs
        mlflow.set_tracking_uri(uri)
    if MlflowClient(uri).get_experiment_by_name(experiment) is None:
        raise LookupError(f"no MLflow experiment {experiment!r} at {uri}: {POINT_ELSEWHERE}")
    clauses = ["tags.`cupid.kind` = 'job'"] + ([filter_string] if filter_string else [])
    try:
        runs = mlflow.search_runs(experiment_names=[experiment], filter_string=" and ".join(clauses),
                                  output_format="list", order_by=["attributes.start_time DESC"])
    except mlflow.exceptions.MlflowException as exc:
        if exc.error_code != "INVALID_PARAMETER_VALUE" or not filter_string:
            raise
        raise LookupError(f"--filter {filter_string!r} is not an MLflow filter string: "
                          f"{first_line(exc)}") from None
    return [_job_run(r) for r in runs]


_RUN_ID_PREFIX = re.compile(r"^[0-9a-f]{1,32}$")
LISTED_CANDIDATES = 5  # an ambiguous prefix names this many of the runs it matches


class RunIdError(ValueError):
    """A run id (or prefix) that names no run, or several: the message is one line."""


def is_run_id_prefix(ref: str) -> bool:
    """Whether ``ref`` can be a run id or the start of one (MLflow's ids are 32 lowercase hex digits)."""
    return bool(_RUN_ID_PREFIX.match(ref))


def resolve_run_id(uri: str, ref: str) -> str:
    """The full id of the one run (in any experiment) whose id starts with ``ref``; else RunIdError."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    if not is_run_id_prefix(ref):
        raise RunIdError(f"{ref!r} is not an MLflow run id or the start of one (lowercase hex digits)")
    try:
        existing_store(uri)
    except LookupError as exc:
        raise RunIdError(str(exc)) from None
    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    found = client.search_runs(experiments, filter_string=f"attributes.run_id LIKE '{ref}%'",
                               run_view_type=ViewType.ACTIVE_ONLY, max_results=LISTED_CANDIDATES + 1,
                               order_by=["attributes.start_time DESC"]) if experiments else []
    if len(found) == 1:
        return found[0].info.run_id
    if not found:
        raise RunIdError(f"no run id starts with {ref!r} in {uri}")
    listed = ", ".join(f"{r.info.run_id} ({r.info.run_name or 'unnamed'})" for r in found[:LISTED_CANDIDATES])
    more = " and more" if len(found) > LISTED_CANDIDATES else ""
    raise RunIdError(f"run id prefix {ref!r} is ambiguous in {uri}: it starts {listed}{more}; give more digits")


def get_job_run(uri: str, run_id: str) -> JobRun:
    """The run ``run_id`` names: its full id, or the start of it when that is unique (``resolve_run_id``)."""
    from mlflow.tracking import MlflowClient

    full = resolve_run_id(uri, run_id)  # first: it says when the store is not there (a client would make one)
    return _job_run(MlflowClient(uri).get_run(full))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_records(uri: str, run_id: str, cache_dir: Path | None = DEFAULT_CACHE) -> list[dict[str, Any]] | None:
    """The run's ``instances.jsonl`` records, cached by run id (finished artifacts never change); None if absent."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow.artifacts

    cached = Path(cache_dir) / run_id / "instances.jsonl" if cache_dir else None
    if cached is None or not cached.exists():
        with tempfile.TemporaryDirectory() as tmp:
            try:
                path = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="instances.jsonl",
                                                                dst_path=tmp, tracking_uri=uri))
            except Exception:  # no such artifact (or unreadable store): the caller reports it
                return None
            if cached is None:
                return read_jsonl(path)
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = cached.with_suffix(".part")
            shutil.copyfile(path, partial)
            os.replace(partial, cached)
    return read_jsonl(cached)


def common_policy(runs: Iterable[JobRun]) -> str:
    """The failure policy the runs share; ``exclude`` when they differ (a failure is then left out everywhere)."""
    policies = {run.failure_policy for run in runs}
    return policies.pop() if len(policies) == 1 else "exclude"
