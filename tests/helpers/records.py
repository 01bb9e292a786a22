"""Synthetic per-instance records shaped like instances.jsonl lines, for scoring, plot and report tests."""

from __future__ import annotations

import numpy as np

TYPES = ("consistent", "contrastive", "changing")


def make_records(n_personas: int = 30, seed: int = 0, shift: float = 0.0, fail_every: int = 17,
                 generation: bool = True) -> list[dict]:
    """Three instances per persona; every ``fail_every``-th fails at ``infer`` (no scores); a persona's skill
    and ``shift`` move all its scores, so runs made with a larger shift score higher."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_personas):
        skill = rng.normal(0, 0.1)
        n_prior = int(rng.integers(8, 12))
        for t in TYPES:
            pos = sorted(int(x) for x in rng.choice(np.arange(1, n_prior + 1), size=2, replace=False))
            words = int(rng.integers(2000, 20000))
            base = float(np.clip(0.5 + shift + skill - 0.00001 * words + rng.normal(0, 0.1), 0.05, 0.95))
            rec = {"key": f"{i}+persona/{t}", "persona_id": f"{i}+persona", "instance_type": t,
                   "relevant_positions": pos, "n_prior_sessions": n_prior, "history_words": words, "errors": [],
                   "gt_checklist_len": 3}
            if len(out) % fail_every == fail_every - 1:
                rec["errors"] = [{"step": "infer", "kind": "unparseable", "message": "x"}]
                rec.update(precision=None, recall=None, f1=None)
            else:
                p, r = base, float(np.clip(base + 0.1, 0, 1))
                rec.update(precision=p, recall=r, f1=2 * p * r / (p + r), n_predicted=3, n_true=3,
                           predicted_matched=3 * p, true_matched=3 * r)
                if generation:
                    rec["judge_score"] = float(np.clip(round(1 + 9 * base), 1, 10))
            out.append(rec)
    return out
