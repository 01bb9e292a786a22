"""Each statistic and the failure policy, defined once; point values, tables and intervals all use them.

``precision`` / ``recall``: means of per-instance values; ``f1``: the harmonic mean of mean P and mean R (the paper's,
*not* a mean of F1s); ``score``: the mean judge score. ``runtime.failure_policy``: ``exclude`` leaves a failed instance
out (counted); ``zero`` scores it 0; ``upstream`` follows the official ``evaluation/pipeline/evaluate.py``: a
context-length error while inferring, decomposing or generating, a failed match or a judge failure score 0, anything
else drops the instance (where its aggregation would crash, its intent is used): docs/failures-and-resume.md.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

if TYPE_CHECKING:  # pandas comes in when a job is summarised, not with a task's per-instance scoring
    import pandas as pd

FAILURE_POLICIES = ("exclude", "zero", "upstream")
TASK_METRICS = {"inference": ("precision", "recall", "f1"), "generation": ("score",)}
HEADLINE = {"inference": "f1", "generation": "score"}
METRIC_FIELDS = {"precision": ("precision",), "recall": ("recall",), "f1": ("precision", "recall"),
                 "score": ("judge_score",)}

SCORED, ZERO, EXCLUDED = "scored", "zero", "excluded"
UPSTREAM_INFERRER_STEPS = ("infer", "decompose")  # one try block in the official tool: infer, then decompose


def harmonic_mean(precision: float, recall: float) -> float:
    """F1 of a precision and a recall (0 when both are 0)."""
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def fields_of(metric: str) -> tuple[str, ...]:
    return METRIC_FIELDS.get(metric, (metric,))


def task_of(metric: str) -> str | None:
    return next((task for task, metrics in TASK_METRICS.items() if metric in metrics), None)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _failed_steps(record: Mapping[str, Any]) -> set[tuple[str, str]]:
    return {(e.get("step", ""), e.get("kind", "")) for e in record.get("errors", [])}


def treatment(record: Mapping[str, Any], task: str, policy: str) -> str:
    """SCORED, ZERO or EXCLUDED: how ``record`` enters ``task``'s statistics under ``policy``."""
    # the official tool saves nothing when inferring or decomposing fails other than by context length
    if policy == "upstream" and task == "generation" and any(
            step in UPSTREAM_INFERRER_STEPS and kind != "context_length" for step, kind in _failed_steps(record)):
        return EXCLUDED
    if all(_number(record.get(f)) for m in TASK_METRICS[task] for f in fields_of(m)):
        return SCORED
    if policy == "exclude":
        return EXCLUDED
    if policy == "zero":
        return ZERO
    if policy != "upstream":
        raise ValueError(f"failure_policy={policy!r}; expected one of {FAILURE_POLICIES}")
    failed = _failed_steps(record)
    steps = {step for step, _ in failed}
    if task == "inference":
        too_long = any(step in UPSTREAM_INFERRER_STEPS and kind == "context_length" for step, kind in failed)
        matched_failed = bool(steps & {"match_precision", "match_recall"}) and record.get("inferred_checklist")
        return ZERO if too_long or matched_failed else EXCLUDED
    return ZERO if "judge" in steps or ("generate", "context_length") in failed else EXCLUDED


def _zeroed(record: Mapping[str, Any], task: str) -> dict[str, Any]:
    """A failed instance scored 0 against full checklist lengths (no inferred items if it never had any)."""
    row = dict(record)
    if task == "inference":
        checklist = record.get("inferred_checklist")
        row.update(precision=0.0, recall=0.0, f1=0.0, predicted_matched=0.0, true_matched=0.0,
                   n_predicted=len(checklist) if isinstance(checklist, list) else 0,
                   n_true=record.get("n_true") or record.get("gt_checklist_len") or 0)
    else:
        row["judge_score"] = 0.0
    return row


def task_frame(records: Iterable[Mapping[str, Any]], task: str, policy: str = "exclude") -> pd.DataFrame:
    """The rows entering ``task``'s statistics (failed ones zero-filled per policy), with a ``treatment`` column."""
    rows = [{**(record if how == SCORED else _zeroed(record, task)), "treatment": how}
            for record in records if (how := treatment(record, task, policy)) != EXCLUDED]
    import pandas as pd

    return pd.DataFrame(rows)


def counts(records: Sequence[Mapping[str, Any]], task: str, policy: str) -> dict[str, Any]:
    """How many instances ran, were scored, failed, and (zero/upstream) entered the means as 0."""
    treatments = [treatment(r, task, policy) for r in records]
    failed = sum(t != SCORED for t in treatments)
    return {"instances": len(records), "scored": len(records) - failed, "failed": failed,
            "zeroed": sum(t == ZERO for t in treatments), "failure_policy": policy}


def point_value(frame: pd.DataFrame, metric: str) -> float:
    """The statistic over the rows of a task frame (NaN when no row enters it)."""
    if frame.empty:
        return math.nan
    if metric == "f1":
        return harmonic_mean(float(frame["precision"].mean()), float(frame["recall"].mean()))
    field = fields_of(metric)[0]
    import pandas as pd

    values = pd.to_numeric(frame[field], errors="coerce").dropna() if field in frame else pd.Series(dtype=float)
    return float(values.mean()) if len(values) else math.nan


def micro(frame: pd.DataFrame) -> dict[str, float]:
    """Upstream's pooled numbers: matched items over checklist lengths, summed over instances."""
    n_predicted, n_true = float(frame["n_predicted"].sum()), float(frame["n_true"].sum())
    p = float(frame["predicted_matched"].sum()) / n_predicted if n_predicted else 0.0
    r = float(frame["true_matched"].sum()) / n_true if n_true else 0.0
    return {"micro/precision": p, "micro/recall": r, "micro/f1": harmonic_mean(p, r)}
