"""A job's identity, by content: what decides its results, never how fast, through which spelling of an endpoint or
with which key it gets them.

It names the job's journal, lock, ledgers and (with the reporting settings) MLflow run. A changed concurrency,
pace, timeout, retry count, worker count, price, Batch API switch or cache setting resumes the same job, as do
``localhost`` for ``127.0.0.1``, a trailing slash and a rotated key; a model, its parameters, a prompt, the data or
the recipe make a new one. The rule (``content``) lives in ``cupid_exp.identity``: the report reads runs by it too.
"""

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
    """Hash of everything that decides a job's results, from the resolved config as plain data.

    The data enter by their digest (the valid rows, in order), not by how a file's path is spelt: a relative and
    an absolute ``data.path`` of the same file are one job (its journal, its MLflow run). Configs without a path
    (``data=cupid``, ``data=sample``) keep the identity they always had. Synthesis has no dataset (its personas
    are drawn from the recipe, which is in the config)."""
    return config_digest({"config": content(resolved, not_identity), "data": dataset_digest,
                          "prompts": prompts_digest})
