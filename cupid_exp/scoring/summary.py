"""Phase 3 of a job: the records and the usage as the job's numbers (the paper's macro P/R/F1 and judge score, and
upstream's micro P/R/F1, overall and per type) and its completeness."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from cupid_exp.data.schema import INSTANCE_TYPES
from cupid_exp.llm.usage import UsageMeter, usage_metrics
from cupid_exp.scoring.names import metric_key
from cupid_exp.scoring.statistics import TASK_METRICS, counts, micro, point_value, task_frame


def _block(frame, task: str) -> dict[str, float]:
    if frame.empty:
        return {"n": 0}
    block = {"n": int(len(frame)), **{m: point_value(frame, m) for m in TASK_METRICS[task]}}
    if task == "inference":
        block["mean_instance_f1"] = float(frame["f1"].mean())
        block.update(micro(frame))
    return block


def task_metrics(records: Sequence[Mapping[str, Any]], task: str, failure_policy: str = "exclude") -> dict[str, Any]:
    """Nested: {'all': {...}, '<type>': {...}, 'counts': {...}} for ``task`` inference or generation."""
    records = list(records)
    frame, present = task_frame(records, task, failure_policy), {r.get("instance_type") for r in records}
    by_type = {itype: _block(frame[frame["instance_type"] == itype] if not frame.empty else frame, task)
               for itype in INSTANCE_TYPES if itype in present}
    return {"all": _block(frame, task), **by_type, "counts": counts(records, task, failure_policy)}


def flat_metrics(task: str, nested: Mapping[str, Any]) -> dict[str, float]:
    """'inference/f1', 'inference/micro/f1', 'inference/changing/f1', 'inference/count/scored', ..."""
    flat: dict[str, float] = {}
    for group, block in nested.items():
        if group == "counts":
            flat.update({f"{task}/count/{k}": float(v) for k, v in block.items() if isinstance(v, (int, float))})
            continue
        flat.update({metric_key(task, group, k): float(v) for k, v in block.items()})
    return flat


def error_counts(records: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    return dict(Counter(key for record in records for err in record.get("errors", [])
                        for key in (err["step"], f"{err['step']}/{err['kind']}")))


@dataclass
class JobSummary:
    """A job's results: records in dataset order, metrics nested by part and flat, and completeness."""

    records: list[dict[str, Any]]
    parts: tuple[str, ...]
    nested: dict[str, dict[str, Any]]  #: part -> {'all': {...}, '<type>': {...}, 'counts': {...}}
    errors: dict[str, int]  #: failed steps by 'step' and 'step/kind'
    metrics: dict[str, float] = field(default_factory=dict)  #: flat, as logged to MLflow
    max_failed_fraction: float = 1.0

    @property
    def n_instances(self) -> int:
        return len(self.records)

    @property
    def n_units(self) -> int:
        """The job lifecycle's name for it (``cupid_exp.job.spec.Summary``)."""
        return self.n_instances

    @property
    def headline(self) -> float | None:
        """What Hydra's sweepers optimise: the first part's F1 (inference) or score (generation)."""
        part = self.parts[0]
        return self.metrics.get(f"{part}/f1" if part == "inference" else f"{part}/score")

    @property
    def failed_instances(self) -> int:
        """Instances with at least one failed step (whatever the failure policy made of them)."""
        return sum(1 for r in self.records if r.get("errors"))

    @property
    def complete(self) -> bool:
        return self.failed_instances == 0

    @property
    def over_threshold(self) -> bool:
        """More instances failed than ``runtime.max_failed_fraction`` allows: the run exits 3."""
        return (self.failed_instances / self.n_instances if self.n_instances else 0.0) > self.max_failed_fraction

    def failure_reasons(self) -> dict[str, int]:
        """Why instances failed: the first failed step/kind of each failed instance."""
        first = Counter(f"{r['errors'][0]['step']}/{r['errors'][0]['kind']}" for r in self.records if r.get("errors"))
        return dict(sorted(first.items()))

    def status_line(self) -> str:
        """The last line a job prints: complete, or how many instances are missing and why."""
        if self.complete:
            return f"complete: {self.n_instances} of {self.n_instances} instances ran without a failed step"
        reasons = ", ".join(f"{k}={v}" for k, v in self.failure_reasons().items())
        verdict = (f"above runtime.max_failed_fraction={self.max_failed_fraction:g}: exit 3" if self.over_threshold
                   else f"within runtime.max_failed_fraction={self.max_failed_fraction:g}")
        return (f"INCOMPLETE: {self.failed_instances} of {self.n_instances} instances failed ({reasons}); "
                f"{verdict}")


def epoch_metrics(records: Sequence[Mapping[str, Any]], parts: Sequence[str], failure_policy: str
                  ) -> dict[str, float]:
    """With ``runtime.epochs`` > 1: each epoch's headline numbers and their mean; nothing with one."""
    epochs = sorted({r["epoch"] for r in records if r.get("epoch") is not None})
    if len(epochs) < 2:
        return {}
    import pandas as pd

    by_epoch: dict[int, dict[str, float]] = {}
    for epoch in epochs:
        mine = [r for r in records if r.get("epoch") == epoch]
        flat = {k: v for part in parts for k, v in flat_metrics(part, task_metrics(mine, part, failure_policy)).items()}
        by_epoch[epoch] = {k: v for k, v in flat.items() if k.count("/") == 1}  # overall numbers only
    out = {f"epoch/{epoch}/{k}": v for epoch, flat in by_epoch.items() for k, v in flat.items()}
    means = pd.DataFrame(by_epoch).mean(axis=1)  # a row per metric, a column per epoch; NaN left out
    return out | {f"epoch/mean/{name}": float(v) for name, v in means.items() if v == v}


def summarize(records: Sequence[Mapping[str, Any]], parts: Sequence[str], *, failure_policy: str, meter: UsageMeter,
              extra_metrics: Mapping[str, float] | None = None, seed: int = 0, with_intervals: bool = True,
              max_failed_fraction: float = 1.0) -> JobSummary:
    """Metrics per part (overall and per type), failure counts, usage and bootstrap intervals."""
    records = [dict(r) for r in records]
    nested = {part: task_metrics(records, part, failure_policy) for part in parts}
    summary = JobSummary(records, tuple(parts), nested, error_counts(records), max_failed_fraction=max_failed_fraction)
    metrics = {k: v for part, block in nested.items() for k, v in flat_metrics(part, block).items()}
    metrics |= usage_metrics(meter) | dict(extra_metrics or {})
    metrics |= {f"errors/{k}": float(v) for k, v in summary.errors.items()}
    metrics |= {"instances/total": float(summary.n_instances), "instances/failed": float(summary.failed_instances),
                "instances/complete": float(summary.complete)}
    if with_intervals and records:
        from cupid_exp.scoring.bootstrap import ci_metrics  # numpy and pandas: loaded once the calls are done

        metrics.update(ci_metrics(records, parts, seed=seed, failure_policy=failure_policy))
    summary.metrics = metrics
    return summary
