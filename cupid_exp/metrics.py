"""Aggregate per-instance records into the paper's numbers, overall and per instance type.

Macro (paper): mean per-instance P and R, F1 = harmonic mean of those means.
Micro (upstream): pooled matched / pooled checklist lengths. Failed instances are
excluded (default) or scored 0 (``failure_policy=zero``, upstream's behaviour) — and
either way counted, so every number says how many instances it covers.
"""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from cupid_exp.data.schema import INSTANCE_TYPES


def _hm(p: float, r: float) -> float:
    return 0.0 if p + r == 0 else 2 * p * r / (p + r)


def _inference_block(df: pd.DataFrame) -> dict[str, float]:
    if df.empty:
        return {"n": 0}
    p, r = df["precision"].mean(), df["recall"].mean()
    mp = df["predicted_matched"].sum() / df["n_predicted"].sum() if df["n_predicted"].sum() else 0.0
    mr = df["true_matched"].sum() / df["n_true"].sum() if df["n_true"].sum() else 0.0
    return {"n": int(len(df)), "precision": float(p), "recall": float(r), "f1": float(_hm(p, r)),
            "mean_instance_f1": float(df["f1"].mean()),
            "micro/precision": float(mp), "micro/recall": float(mr), "micro/f1": float(_hm(mp, mr))}


def inference_metrics(records: Iterable[dict[str, Any]], failure_policy: str = "exclude") -> dict[str, Any]:
    """Nested metrics: {'all': {...}, '<type>': {...}, 'counts': {...}}."""
    df = pd.DataFrame(list(records))
    if df.empty:
        return {"all": {"n": 0}, "counts": {"instances": 0, "scored": 0, "failed": 0}}
    if "precision" not in df:
        df["precision"] = float("nan")
    failed = df["precision"].isna()
    if failure_policy == "zero":
        # upstream scores a failed instance 0 against full checklist lengths
        df.loc[failed, ["precision", "recall", "f1", "predicted_matched", "true_matched"]] = 0.0
        if "n_predicted" not in df:
            df["n_predicted"] = float("nan")
        if "inferred_checklist" in df:  # the checklist exists when only matching failed
            known = df["inferred_checklist"].map(lambda c: len(c) if isinstance(c, list) else float("nan"))
            df["n_predicted"] = df["n_predicted"].fillna(known)
        df["n_predicted"] = df["n_predicted"].fillna(0)
        if "n_true" not in df or df["n_true"].isna().any():
            df["n_true"] = df.get("n_true", pd.Series(float("nan"), index=df.index)).fillna(df["gt_checklist_len"])
        scored = df
    elif failure_policy == "exclude":
        scored = df[~failed]
    else:
        raise ValueError(f"runtime.failure_policy={failure_policy!r}; expected exclude or zero")
    out: dict[str, Any] = {"all": _inference_block(scored)}
    for itype in INSTANCE_TYPES:
        part = scored[scored["instance_type"] == itype]
        if len(df[df["instance_type"] == itype]):
            out[itype] = _inference_block(part)
    out["counts"] = {"instances": int(len(df)), "scored": int((~failed).sum()),
                     "failed": int(failed.sum()), "failure_policy": failure_policy}
    return out


def error_counts(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Failed steps per 'step' and per 'step/kind'."""
    counts: dict[str, int] = {}
    for rec in records:
        for err in rec.get("errors", []):
            for key in (err["step"], f"{err['step']}/{err['kind']}"):
                counts[key] = counts.get(key, 0) + 1
    return counts


def flat_metrics(task: str, nested: dict[str, Any]) -> dict[str, float]:
    """'inference/f1', 'inference/micro/f1', 'inference/changing/f1', 'inference/count/scored', ..."""
    flat: dict[str, float] = {}
    for group, block in nested.items():
        if group == "counts":
            for k, v in block.items():
                if isinstance(v, (int, float)):
                    flat[f"{task}/count/{k}"] = float(v)
            continue
        prefix = task if group == "all" else f"{task}/{group}"
        for k, v in block.items():
            flat[f"{prefix}/{k}"] = float(v)
    return flat


def generation_metrics(records: Iterable[dict[str, Any]], failure_policy: str = "exclude") -> dict[str, Any]:
    """Mean judge score (1–10) overall and per type; an unparseable judgment is a failure, not a 0."""
    df = pd.DataFrame(list(records))
    if df.empty:
        return {"all": {"n": 0}, "counts": {"instances": 0, "scored": 0, "failed": 0}}
    if "judge_score" not in df:
        df["judge_score"] = float("nan")
    failed = df["judge_score"].isna()
    if failure_policy == "zero":
        df.loc[failed, "judge_score"] = 0.0
        scored = df
    elif failure_policy == "exclude":
        scored = df[~failed]
    else:
        raise ValueError(f"runtime.failure_policy={failure_policy!r}; expected exclude or zero")

    def block(part: pd.DataFrame) -> dict[str, float]:
        return {"n": int(len(part)), "score": float(part["judge_score"].mean())} if len(part) else {"n": 0}

    out: dict[str, Any] = {"all": block(scored)}
    for itype in INSTANCE_TYPES:
        if len(df[df["instance_type"] == itype]):
            out[itype] = block(scored[scored["instance_type"] == itype])
    out["counts"] = {"instances": int(len(df)), "scored": int((~failed).sum()), "failed": int(failed.sum()),
                     "failure_policy": failure_policy}
    return out


def retrieval_metrics(records: Iterable[dict[str, Any]]) -> dict[str, float]:
    """recall@k / precision@k of the oracle sessions (overall and per type), and how often a
    contrastive or a stale session was retrieved, over the instances that have one."""
    rows = [{"instance_type": r["instance_type"], **r["retrieval"]} for r in records if r.get("retrieval")]
    if not rows:
        return {}
    df = pd.DataFrame(rows)
    out: dict[str, float] = {}

    def put(prefix: str, part: pd.DataFrame) -> None:
        for name in ("recall_at_k", "precision_at_k"):
            values = part[name].dropna()
            if len(values):
                out[f"{prefix}/{name}"] = float(values.mean())

    put("retrieval", df)
    for itype in INSTANCE_TYPES:
        if (df["instance_type"] == itype).any():
            put(f"retrieval/{itype}", df[df["instance_type"] == itype])
    for name, metric in (("contrastive_hit", "contrastive_hit_rate"), ("stale_hit", "stale_hit_rate")):
        values = df[name].dropna()
        if len(values):
            out[f"retrieval/{metric}"] = float(values.mean())
            out[f"retrieval/{metric}/n"] = float(len(values))
    return out
