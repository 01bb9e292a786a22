"""A job's identity, by content: what decides its results, never how fast, through which endpoint spelling or with which
key. It names the journal, lock, ledgers and MLflow run; the rule lives in ``cupid_exp.identity``."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from cupid_exp.config import config_digest
from cupid_exp.identity import content


def content_digest(config: Mapping[str, Any], not_identity: Iterable[str] = (), *, length: int = 20,
                   **beside: object) -> str:
    """A short hash of ``config``'s content (``content``) and of what goes ``beside`` it (a prompts folder)."""
    return config_digest({**beside, "config": content(config, not_identity)}, length=length)


def job_identity(resolved: Mapping[str, Any], *, dataset_digest: str | None = None, prompts_digest: str,
                 not_identity: Iterable[str] = ("data.path",)) -> str:
    """Hash of what decides a job's results; the data enter by digest, not by how their path is spelt."""
    return config_digest({"config": content(resolved, not_identity), "data": dataset_digest,
                          "prompts": prompts_digest})
