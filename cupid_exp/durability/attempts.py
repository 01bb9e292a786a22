"""A job's attempts: what makes two processes the same job (the *run key*: one MLflow run), and what earlier attempts
spent (from the usage ledger), so a resumed run reports the whole job's usage."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from cupid_exp.identity import REPORT_SETTINGS
from cupid_exp.llm.usage import UsageMeter, requests_sent, usage_metrics

if TYPE_CHECKING:
    from cupid_exp.durability.job_lock import JobLock

#: The usage a resumed job's MLflow run reports for the whole job (this attempt + earlier ones) under these
#: names, with ``<name>/this_attempt`` and ``<name>/earlier_attempts`` beside them; its other usage metrics (per
#: step, requests, failures) are the whole job's too. The attempt's own folder (metrics.json, the console) keeps
#: the attempt's, with ``<name>/earlier_attempts``.
JOB_USAGE = {"calls/total": "calls", "calls/requests": "requests", "tokens/prompt": "prompt_tokens",
             "tokens/completion": "completion_tokens", "cost/usd": "cost_usd"}


def run_key(identity: str, runtime: object, output_root: str | Path) -> str:
    """What makes two jobs one MLflow run: the identity, the output root and the settings that change the report."""
    payload = {"identity": identity, "output_root": str(Path(output_root).expanduser().resolve()),
               **{name: getattr(runtime, name) for name in REPORT_SETTINGS}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]


@dataclass
class Claim:
    """The right to reopen the run key's earlier run: the job's lock, or None (``runtime.resume=false``)."""

    key: str
    lock: JobLock | None = None

    @property
    def exclusive(self) -> bool:
        return self.lock is not None

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def earlier_usage(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Calls, tokens and cost of journalled instances; ``unpriced_instances``: those with calls but no recorded cost."""
    out = {"calls": 0.0, "prompt_tokens": 0.0, "completion_tokens": 0.0, "cost_usd": 0.0, "cache_hits": 0.0,
           "instances": 0.0, "unpriced_instances": 0.0}
    for record in records:
        out["instances"] += 1
        steps = (record.get("usage") or {}).values()
        for usage in steps:
            for key in ("calls", "prompt_tokens", "completion_tokens", "cost_usd", "cache_hits"):
                out[key] += float(usage.get(key, 0) or 0)
        if any(u.get("calls") and "cost_usd" not in u for u in steps):
            out["unpriced_instances"] += 1
    return out


def earlier_spend(earlier: UsageMeter | None) -> dict[str, float]:
    """Totals of what the earlier attempts counted, ``requests`` included; nothing without a journal."""
    if earlier is None:
        return {}
    totals = earlier.totals()
    return {**totals, "requests": requests_sent(totals)}


def whole_job_usage(earlier: UsageMeter | None, this: UsageMeter) -> dict[str, float]:
    """Every usage metric of the whole job, earlier attempts and this one together (none without a journal)."""
    if earlier is None:
        return {}
    whole = UsageMeter()
    whole.merge(earlier.as_dict())
    whole.merge(this.as_dict())
    return usage_metrics(whole)


def earlier_attempt_metrics(earlier: Mapping[str, float]) -> dict[str, float]:
    """``<name>/earlier_attempts`` for the job's summary (``unpriced_instances``: see ``earlier_usage``)."""
    out = {f"{name}/earlier_attempts": earlier.get(field, 0.0) for name, field in JOB_USAGE.items()}
    if earlier.get("unpriced_instances"):
        out["cost/usd/earlier_unpriced_instances"] = earlier["unpriced_instances"]
    return out


def whole_job_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """For the run: the whole job under the usual names, this attempt's as ``<name>/this_attempt``."""
    out: dict[str, float] = {}
    for name in JOB_USAGE:
        this = float(metrics.get(name, 0.0))
        out[f"{name}/this_attempt"] = this
        out[name] = this + float(metrics.get(f"{name}/earlier_attempts", 0.0))
    return out
