"""A job's numbers, overall and per type: the paper's macro P/R/F1 and judge score, and upstream's micro P/R/F1."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from cupid_exp.data.schema import INSTANCE_TYPES
from cupid_exp.scoring.names import metric_key
from cupid_exp.scoring.statistics import TASK_METRICS, counts, micro, point_value, task_frame


def _block(frame, task: str) -> dict[str, float]:
    if frame.empty:
        return {"n": 0}
    block: dict[str, float] = {"n": int(len(frame))}
    block.update({m: point_value(frame, m) for m in TASK_METRICS[task]})
    if task == "inference":
        block["mean_instance_f1"] = float(frame["f1"].mean())
        block.update(micro(frame))
    return block


def task_metrics(records: Sequence[Mapping[str, Any]], task: str, failure_policy: str = "exclude") -> dict[str, Any]:
    """Nested: {'all': {...}, '<type>': {...}, 'counts': {...}} for ``task`` inference or generation."""
    records = list(records)
    frame = task_frame(records, task, failure_policy)
    out: dict[str, Any] = {"all": _block(frame, task)}
    for itype in INSTANCE_TYPES:
        if any(r.get("instance_type") == itype for r in records):
            part = frame[frame["instance_type"] == itype] if not frame.empty else frame
            out[itype] = _block(part, task)
    out["counts"] = counts(records, task, failure_policy)
    return out


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
    out: dict[str, int] = {}
    for record in records:
        for err in record.get("errors", []):
            for key in (err["step"], f"{err['step']}/{err['kind']}"):
                out[key] = out.get(key, 0) + 1
    return out
