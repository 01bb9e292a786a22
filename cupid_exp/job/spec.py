"""What a job is: its kind of work, units, identity and attempt. ``Work`` is a loaded kind (frozen data plus its
``Kind``); ``JobSpec`` is planning's result; a ``Job`` is a spec with its ``Attempt`` and clients."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, TypedDict

from cupid_exp.config import JobConfig, ModelConfig, ServerConfig
from cupid_exp.llm.usage import UsageMeter

if TYPE_CHECKING:
    from cupid_exp.durability.job_lock import JobLock
    from cupid_exp.durability.journal import Journal
    from cupid_exp.durability.ledger import UsageLedger
    from cupid_exp.llm.budget import Budget
    from cupid_exp.progress import Progress
    from cupid_exp.tracking.live import DatasetInput, PlotRequest
    from cupid_exp.tracking.mlflow import SweepParent


class _Prompts(TypedDict):
    prompts_digest: str


class Digests(_Prompts, total=False):
    """What enters a job's identity besides its config (``identity.job_identity``'s keywords)."""

    dataset_digest: str | None


@dataclass
class Execution:
    """What a job's model phase produced (``job.workers.execute``), and what it cost in time."""

    results: list[Any]  #: fresh results (``Result``), in completion order
    seconds: float = 0.0  #: wall time calling models and scoring (without start-up or logging)
    cpu_seconds: float = 0.0  #: CPU time in that phase (the orchestration cost), worker processes' included


class Unit(Protocol):
    """One unit of work (an instance, a persona template)."""

    @property
    def key(self) -> str: ...


class Result(Unit, Protocol):
    """A finished unit: its journal record (``to_record``: a dict with its ``key`` and ``errors``)."""

    def to_record(self) -> dict[str, Any]: ...


class Summary(Protocol):
    """A job's results as the lifecycle reads them (the kind's summary has more)."""

    metrics: dict[str, float]  #: flat, as logged to MLflow (the lifecycle adds usage across attempts and time)

    @property
    def n_units(self) -> int: ...

    @property
    def complete(self) -> bool: ...

    @property
    def over_threshold(self) -> bool: ...

    @property
    def headline(self) -> Any:  # what Hydra's sweepers optimise (the run's Outcome carries it)
        ...

    def status_line(self) -> str: ...


@dataclass
class TrackingView:
    """What a kind adds to the job's MLflow run (``job.publish.start_tracking``)."""

    run_name: str
    tags: dict[str, str]
    dataset: DatasetInput | None = None  #: the run's MLflow dataset input
    parts: tuple[str, ...] = ()  #: evaluation's task parts: running scores in the progress points
    policy: str = "exclude"
    trace_tags: dict[str, str] = field(default_factory=dict)
    judges: dict[str, str] = field(default_factory=dict)
    plots: PlotRequest | None = None  #: drawn by the run worker
    shown: dict[str, tuple[str, str]] = field(default_factory=dict)  #: an evaluated instance's request and factor,
    #: by key: a journalled one's trace is rebuilt where the run lacks it (``tracking.reopen``)


@dataclass
class Published:
    """A finished job's own files and run contents (``Kind.publish``): the lifecycle adds usage and the end."""

    files: list[Path]  #: written in the job's folder, logged as the run's artifacts
    tags: dict[str, str]
    report: Callable[[str, str], str]  #: the console report, from where the results are and the status line
    table: list[dict[str, Any]] | None = None  #: the run's table (scrubbed records)
    replies: list[Path] = field(default_factory=list)  #: files among ``files`` whose records' ``raw`` replies the
    #: run's traces hold: logged without them (a reply stored once in the run)


class Kind(Protocol):
    """The four verbs the lifecycle calls on a kind of work. Its state is frozen data: it travels to workers."""

    def connect(self, meter: UsageMeter, budget: Budget | None, share: tuple[int, int]) -> tuple[Any, int]:
        """The clients and how many units run at once; ``share``: this process's index and the process count."""

    async def run(self, ctx: Any, unit: Any, progress: Progress | None) -> Result:
        """One unit, start to end; a failed step is recorded on its result, never raised."""

    def summarise(self, job: Job, execution: Execution) -> Summary:
        """The job's results: the journal's finished units and this attempt's fresh ones."""

    def publish(self, job: Job, summary: Any, complete: bool) -> Published:
        """Write the job's files (a dry run's too); what the MLflow run and the console get of them."""


@dataclass(frozen=True)
class Work:
    """A kind of work once loaded, fixed at load. Workers get it without ``units`` and ``tracking``."""

    kind: Kind
    noun: str  #: what a unit is called in lines and metric names: "instance", "persona" (plural: +s)
    units: tuple[Any, ...]  #: every unit of the job (``Unit``), in the job's order
    title: str  #: the report's first line
    roles: Mapping[str, ModelConfig]  #: the roles a run of the units calls (for the key check)
    digests: Digests  #: what enters the identity besides the config
    not_identity: tuple[str, ...]  #: dotted config keys that do not change its results (``identity.content``)
    stages: tuple[str, ...]  #: the progress bars' stages
    tracking: TrackingView | None  #: what the job's MLflow run gets besides the config and the identity
    record_fields: Mapping[str, type | tuple[type, ...]]  #: a whole journal record's fields, with their types
    final: Callable[[Mapping[str, Any], bool], bool]  #: whether a journalled unit stands on resume (picklable)
    units_per_process: int  #: ``runtime.workers=auto`` adds a process per this many units left
    client_modules: tuple[str, ...]  #: what its clients import: imported before a worker process is forked
    summary_modules: tuple[str, ...]  #: what its summary imports: imported while the models answer
    model_server: ServerConfig | None = None  #: a model server the job starts around its calls (``llm.server``)


@dataclass(frozen=True)
class JobSpec:
    """A planned job: everything decided before the first file is opened, fixed from then on."""

    cfg: JobConfig  #: the typed, checked config
    work: Work  #: its kind of work, loaded
    resolved: Mapping[str, Any]  #: the resolved config as plain data, secrets redacted (MLflow params, config.yaml)
    output_dir: Path
    choices: Mapping[str, str]  #: Hydra's group choices (model=..., synthesis=...)
    parent_run: "str | SweepParent | None"  #: the sweep's MLflow parent run (by id, or by the sweep's folder)
    secrets: tuple[str, ...]
    identity: str  #: hash of what decides the results (``identity.job_identity``): names the journal and the lock
    run_key: str  #: the identity plus what changes the report (``durability.attempts.run_key``): names the run

    @property
    def dry_run(self) -> bool:
        return bool(self.cfg.calls.dry_run)

    @property
    def journal_dir(self) -> Path:
        return Path(self.cfg.paths.output_root) / "journal"


@dataclass
class Attempt:
    """The resources one attempt of a job holds until it ends (``release``)."""

    lock: JobLock | None  #: this process's hold on the job; None in a dry run
    journal: Journal | None  #: finished units, one a line; None in a dry run or with ``runtime.resume=false``
    ledger: UsageLedger | None  #: every paid request as it returns, beside the journal (the meter writes into it)
    earlier: UsageMeter | None  #: what the job's earlier attempts counted (the ledger); None without a journal
    done: dict[str, dict[str, Any]]  #: key -> finished record from the journal
    budget: Budget | None  #: the spending limits its calls draw on; None: no budget
    processes: int = 1  #: processes sharing the model calls (``runtime.workers``: ``job.worker_count``)
    meter: UsageMeter = field(default_factory=UsageMeter)  #: this attempt's usage, every process's merged

    def release(self) -> None:
        """Let another process take the job (its end; idempotent)."""
        if self.lock is not None:
            self.lock.release()


@dataclass
class Job:
    """A planned job: its frozen spec, the attempt that holds it, and its clients once connected."""

    spec: JobSpec
    attempt: Attempt
    ctx: Any = None  #: the work's clients (``Kind.connect``): None until ``connect``, and when nothing is left to run
    lanes: int = 1  #: how many units this process runs at once with them

    @property
    def cfg(self) -> Any:  # the kind's config (``RunConfig``, ``SynthesizeConfig``): typed as the kind reads it
        return self.spec.cfg

    @property
    def work(self) -> Work:
        return self.spec.work

    @property
    def identity(self) -> str:
        return self.spec.identity

    @property
    def output_dir(self) -> Path:
        return self.spec.output_dir

    @property
    def dry_run(self) -> bool:
        return self.spec.dry_run

    @property
    def todo(self) -> list[Any]:
        """The units left to run, in the job's order."""
        return [u for u in self.work.units if u.key not in self.attempt.done]

    def release(self) -> None:
        self.attempt.release()
