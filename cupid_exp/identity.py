"""What decides a result, by content: one rule for a job's identity and the report's rows."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterable, Mapping

from cupid_exp.config import config_digest
from cupid_exp.llm.endpoints import canonical_api_base
from cupid_exp.secrets import redact

#: Where a job is written or logged, how progress shows, how failures enter the means (aggregation reads the
#: journal, so another policy replays it for free).
NOT_IDENTITY = {"paths", "tracking", "hydra"}
#: How calls are made (``calls``), paced (``pools``: a provider pool's limits), retried, shared among processes,
#: cached and budgeted, and how the job reports (``runtime``): none decides a reply.
RUNTIME_NOT_IDENTITY = {"progress", "cache", "cache_dir", "resume", "failure_policy", "max_failed_fraction",
                        "retry_failed", "workers", "max_cost_usd", "sweep_max_cost_usd", "timeout", "num_retries",
                        "rate_limit_patience_s", "outage_patience_s", "batch", "batch_size", "batch_delay_s",
                        "batch_poll_s", "dry_run_completion_tokens", "pools"}
#: The runtime settings that change what is reported from the same results: in the run key
#: (``durability.attempts.run_key``) and in the job folder's name (``folder_fingerprint``): a folder holds one report,
#: as an MLflow run does.
REPORT_SETTINGS = ("failure_policy", "max_failed_fraction", "retry_failed")
#: A model config's throughput, pacing (``pool``: its provider pool and the pool's limits), prices (``model_info``)
#: and key variable (``config.ModelConfig``); ``rpm``, ``tpm`` and the prices stood at the top of a model config
#: until 2026-11-29, and runs logged then still name them so.
MODEL_NOT_IDENTITY = {"max_concurrency", "pool", "model_info", "api_key_env", "batch", "rpm", "tpm",
                      "input_cost_per_token", "output_cost_per_token"}
#: An embedded model's threads, kernels and caches (``config.LocalModelConfig``): how llama.cpp computes, not what.
LOCAL_NOT_IDENTITY = {"n_threads", "n_threads_batch", "n_batch", "prompt_cache_mb", "flash_attn"}


def by_content(value: object) -> object:
    """``value`` with every model config (a mapping with ``litellm_model``) reduced to what decides its replies."""
    if isinstance(value, Mapping):
        if "litellm_model" in value:
            return _model(value)
        return {k: by_content(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [by_content(v) for v in value]
    return value


def _model(model: Mapping[str, object]) -> dict[str, object]:
    out = {k: by_content(v) for k, v in model.items() if k not in MODEL_NOT_IDENTITY}
    if not out.get("keep_cut_replies"):
        out.pop("keep_cut_replies", None)  # the default: the identity of every job before the key existed
    if out.get("api_base"):
        out["api_base"] = canonical_api_base(out["api_base"])
    if isinstance(out.get("local"), Mapping):
        out["local"] = {k: v for k, v in out["local"].items() if k not in LOCAL_NOT_IDENTITY}
    return out


def content(resolved: Mapping[str, object], not_identity: Iterable[str] = ()) -> dict[str, object]:
    """The resolved config as it decides results: secrets masked (names count, values not), paths, tracking and the
    runtime's how-to left out, models by content, ``not_identity`` keys dropped."""
    config = redact({k: v for k, v in resolved.items() if k not in NOT_IDENTITY})
    if "runtime" in config or "calls" in config:
        # judged as one mapping, as when ``calls`` was part of ``runtime``: every earlier identity stands
        runtime = {**dict(config.pop("runtime", None) or {}), **dict(config.pop("calls", None) or {})}
        config["runtime"] = {k: v for k, v in runtime.items() if k not in RUNTIME_NOT_IDENTITY
                             and not (k == "epochs" and str(v) == "1")}  # one epoch: the identity before epochs
    config = by_content(config)
    for dotted in not_identity:
        *parents, last = dotted.split(".")
        node = config
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return config


def short_key(key: str) -> str:
    """A key as labels say it: the model's own keys without ``model.``, every other key whole."""
    return key.removeprefix("model.params.").removeprefix("model.")


def subset_text(limit: int | None, types: Iterable[str] = ()) -> str:
    """'data.limit=1, data.instance_types=[changing]': the part of the data a job took; empty for all."""
    return ", ".join(([f"data.limit={limit}"] if limit is not None else [])
                     + ([f"data.instance_types=[{','.join(types)}]"] if types else []))


def folder_fingerprint(resolved: Mapping[str, object]) -> str:
    """Short hash naming an evaluation job's folder: the config by ``content``, the prompt files, the data files' bytes
    (Hydra names the folder before the rows are read) and ``REPORT_SETTINGS``. What cannot be read enters by name."""
    from cupid_exp.prompts import EVALUATION_PROMPTS, PromptSet

    runtime = resolved.get("runtime") if isinstance(resolved.get("runtime"), Mapping) else {}
    directory = (resolved.get("prompts") or {}).get("dir")
    try:
        prompts = PromptSet(directory if isinstance(directory, str) else None).digest(EVALUATION_PROMPTS)
    except OSError:  # not a folder
        prompts = f"missing:{directory}"
    return content_digest(resolved, ("data.path",), length=8, data=_files_digest(resolved.get("data")),
                          prompts=prompts, report={k: runtime.get(k) for k in REPORT_SETTINGS})


def _files_digest(data: object) -> str | None:
    """Hash of the bytes of the files a ``data`` config reads (None for the Hub's, or for a path that is not there)."""
    from cupid_exp.data.loading import LOCAL_SUFFIXES, SAMPLE_PATH

    if not isinstance(data, Mapping):
        return None
    paths: list[Path] = []
    if data.get("source") == "sample":
        paths = [SAMPLE_PATH]
    elif data.get("source") == "local" and isinstance(data.get("path"), str):
        path = Path(data["path"]).expanduser()
        paths = (sorted(p for p in path.iterdir() if p.suffix in LOCAL_SUFFIXES and p.is_file()) if path.is_dir()
                 else [path] if path.is_file() else [])
    if not paths:
        return None
    digest = hashlib.sha256()
    for path in paths:
        try:
            with path.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
        except OSError:  # unreadable
            digest.update(str(path).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def content_digest(config: Mapping[str, Any], not_identity: Iterable[str] = (), *, length: int = 20,
                   **beside: object) -> str:
    """A short hash of ``config``'s content (``content``) and of what goes ``beside`` it (a prompts folder)."""
    return config_digest({**beside, "config": content(config, not_identity)}, length=length)


def job_identity(resolved: Mapping[str, Any], *, dataset_digest: str | None = None, prompts_digest: str,
                 not_identity: Iterable[str] = ("data.path",)) -> str:
    """Hash of what decides a job's results (it names the journal, lock, ledgers and MLflow run); the data enter by
    digest, not by how their path is spelt."""
    return content_digest(resolved, not_identity, data=dataset_digest, prompts=prompts_digest)
