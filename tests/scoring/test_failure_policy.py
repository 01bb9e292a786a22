"""The failure policy, defined once in ``scoring.statistics``: how a failed instance enters every number.

``upstream`` is the official tool's rule (spec §2.6, evaluation/pipeline/evaluate.py): inference — a
context-length error while inferring or decomposing scores 0 with no inferred items, a failed match scores 0
against full checklist lengths, any other failure drops the instance; generation — any judge failure or a
context-length error while generating scores 0, any other failure drops it, and an inference failure that
dropped the instance drops its generation too (task=both: the official tool returns before generating).
Expected values are computed by hand in the comments.
"""

from __future__ import annotations

import pytest

from cupid_exp.config import FAILURE_POLICIES as CONFIG_POLICIES
from cupid_exp.scoring.bootstrap import bootstrap_ci, ci_metrics, paired_compare
from cupid_exp.scoring.statistics import FAILURE_POLICIES, task_frame, treatment
from cupid_exp.scoring.summary import flat_metrics, task_metrics


def err(step: str, kind: str) -> list[dict]:
    return [{"step": step, "kind": kind, "message": "m"}]


def scored(key: str, itype: str, pm: float, n_pred: int, tm: float, n_true: int, **extra) -> dict:
    p, r = pm / n_pred, tm / n_true
    return {"key": key, "persona_id": key.split("/")[0], "instance_type": itype, "predicted_matched": pm,
            "n_predicted": n_pred, "true_matched": tm, "n_true": n_true, "precision": p, "recall": r,
            "f1": 0.0 if p + r == 0 else 2 * p * r / (p + r), "gt_checklist_len": n_true, "errors": [], **extra}


def failed(key: str, itype: str, errors: list[dict], **extra) -> dict:
    return {"key": key, "persona_id": key.split("/")[0], "instance_type": itype, "errors": errors, **extra}


# the scored four of tests/scoring/test_metrics.py: P 1, .5, .25, 1; R .5, 1, .25, 0; matched 6 of 11 / 5 of 12
SCORED = [scored("a/consistent", "consistent", 2, 2, 1, 2), scored("b/contrastive", "contrastive", 2, 4, 3, 3),
          scored("c/changing", "changing", 1, 4, 1, 4), scored("d/consistent", "consistent", 1, 1, 0, 3)]
MATCH_FAILED = failed("e/changing", "changing", err("match_precision", "unparseable"), inferred_preference="p",
                      inferred_checklist=["x", "y"], gt_checklist_len=3)
TOO_LONG = failed("f/changing", "changing", err("infer", "context_length"), gt_checklist_len=4)
UNPARSEABLE = failed("g/consistent", "consistent", err("infer", "unparseable"), gt_checklist_len=5)
INFERENCE = SCORED + [MATCH_FAILED, TOO_LONG, UNPARSEABLE]


def test_the_config_and_scoring_know_the_same_policies() -> None:
    assert tuple(CONFIG_POLICIES) == tuple(FAILURE_POLICIES) == ("exclude", "zero", "upstream")


@pytest.mark.parametrize("task, record, expected", [
    ("inference", MATCH_FAILED, "zero"),
    ("inference", failed("k/consistent", "consistent", err("match_recall", "timeout"),
                         inferred_checklist=["x"]), "zero"),
    # a match that failed before any inferred item existed has nothing to score against: dropped
    ("inference", failed("k/consistent", "consistent", err("match_recall", "timeout")), "excluded"),
    ("inference", TOO_LONG, "zero"),
    ("inference", UNPARSEABLE, "excluded"),
    ("inference", failed("k/consistent", "consistent", err("infer", "rate_limit")), "excluded"),
    # the official inferrer decomposes inside the same try: a context-length error there is saved as empty
    ("inference", failed("k/consistent", "consistent", err("decompose", "context_length"),
                         inferred_preference="p"), "zero"),
    ("inference", failed("k/consistent", "consistent", err("decompose", "unparseable"),
                         inferred_preference="p"), "excluded"),
    ("generation", failed("k/changing", "changing", err("judge", "unparseable"), response="r"), "zero"),
    ("generation", failed("k/changing", "changing", err("judge", "timeout"), response="r"), "zero"),
    ("generation", failed("k/changing", "changing", err("generate", "context_length")), "zero"),
    ("generation", failed("k/changing", "changing", err("generate", "provider")), "excluded"),
    ("generation", failed("k/changing", "changing", err("generate", "unparseable")), "excluded"),
    ("inference", failed("k/changing", "changing", err("judge", "unparseable"), precision=0.5, recall=0.5,
                         f1=0.5), "scored"),
])
def test_upstream_treatment(task, record, expected) -> None:
    assert treatment(record, task, "upstream") == expected
    if expected != "scored":  # the other policies do not look at the step
        assert treatment(record, task, "exclude") == "excluded"
        assert treatment(record, task, "zero") == "zero"


@pytest.mark.parametrize("errors, expected", [
    (err("infer", "unparseable"), "excluded"),  # no result saved: the official tool never generated
    (err("decompose", "provider"), "excluded"),
    (err("infer", "context_length"), "scored"),  # saved as an empty inference; generation went on
    (err("match_recall", "unparseable"), "scored"),  # saved as a zero match; generation went on
])
def test_upstream_generation_follows_what_the_official_tool_did_after_inference(errors, expected) -> None:
    record = failed("k/changing", "changing", errors, response="r", judge_score=7.0)
    assert treatment(record, "generation", "upstream") == expected
    assert treatment(record, "generation", "exclude") == treatment(record, "generation", "zero") == "scored"


def test_upstream_inference_numbers() -> None:
    out = task_metrics(INFERENCE, "inference", "upstream")
    m = out["all"]
    # the match failure and the context-length failure enter as 0; the unparseable inference is left out
    assert m["n"] == 6
    assert m["precision"] == pytest.approx(2.75 / 6)  # (1 + .5 + .25 + 1 + 0 + 0) / 6
    assert m["recall"] == pytest.approx(1.75 / 6)  # (.5 + 1 + .25 + 0 + 0 + 0) / 6
    p, r = 2.75 / 6, 1.75 / 6
    assert m["f1"] == pytest.approx(2 * p * r / (p + r))
    # micro: the match failure brings its 2 inferred items and 3 true ones, the context failure 0 and 4
    assert m["micro/precision"] == pytest.approx(6 / 13)
    assert m["micro/recall"] == pytest.approx(5 / 19)
    assert out["changing"]["n"] == 3 and out["changing"]["precision"] == pytest.approx(0.25 / 3)
    assert out["consistent"]["n"] == 2  # the unparseable consistent instance is not in it
    assert out["counts"] == {"instances": 7, "scored": 4, "failed": 3, "zeroed": 2, "failure_policy": "upstream"}
    flat = flat_metrics("inference", out)
    assert flat["inference/count/zeroed"] == 2.0 and flat["inference/n"] == 6.0


def test_upstream_sits_between_exclude_and_zero() -> None:
    n = {policy: task_metrics(INFERENCE, "inference", policy)["all"]["n"] for policy in FAILURE_POLICIES}
    assert n == {"exclude": 4, "zero": 7, "upstream": 6}
    zeroed = task_frame(INFERENCE, "inference", "upstream")
    assert list(zeroed["treatment"]) == ["scored"] * 4 + ["zero", "zero"]
    assert list(zeroed["n_predicted"][4:]) == [2, 0] and list(zeroed["n_true"][4:]) == [3, 4]


def test_upstream_generation_numbers() -> None:
    records = [failed("a/consistent", "consistent", [], judge_score=8.0),
               failed("b/consistent", "consistent", [], judge_score=6.0),
               failed("c/changing", "changing", err("judge", "unparseable"), response="r"),
               failed("d/changing", "changing", err("generate", "context_length")),
               failed("e/changing", "changing", err("generate", "provider"))]
    out = task_metrics(records, "generation", "upstream")
    assert out["all"]["n"] == 4 and out["all"]["score"] == pytest.approx(3.5)  # (8 + 6 + 0 + 0) / 4
    assert out["changing"] == {"n": 2, "score": 0.0}
    assert out["counts"]["zeroed"] == 2 and out["counts"]["failed"] == 3
    assert task_metrics(records, "generation", "exclude")["all"]["score"] == pytest.approx(7.0)
    assert task_metrics(records, "generation", "zero")["all"]["score"] == pytest.approx(14 / 5)


def test_intervals_are_around_the_upstream_number() -> None:
    point = task_metrics(INFERENCE, "inference", "upstream")["all"]
    for metric in ("precision", "recall", "f1"):
        est = bootstrap_ci(INFERENCE, metric, n_boot=300, failure_policy="upstream")
        assert est.value == pytest.approx(point[metric]) and est.n == 6
        assert est.low <= est.value <= est.high
    flat = ci_metrics(INFERENCE, ["inference"], n_boot=300, failure_policy="upstream")
    assert flat["inference/f1/ci_low"] == bootstrap_ci(INFERENCE, "f1", n_boot=300, failure_policy="upstream").low


def test_a_paired_comparison_under_upstream_keeps_a_failed_match_as_zero() -> None:
    a = [scored("x/consistent", "consistent", 1, 2, 1, 2), scored("y/consistent", "consistent", 2, 2, 2, 2)]
    b = [dict(MATCH_FAILED, key="x/consistent", persona_id="x", instance_type="consistent"),
         scored("y/consistent", "consistent", 2, 2, 2, 2)]
    upstream = paired_compare(a, b, "precision", n_boot=100, failure_policy="upstream")
    assert upstream.n_shared == 2 and upstream.b == pytest.approx(0.5)  # (0 + 1) / 2
    assert upstream.diff == pytest.approx(-0.25)  # A: (.5 + 1) / 2
    excluded = paired_compare(a, b, "precision", n_boot=100, failure_policy="exclude")
    assert excluded.n_shared == 1 and excluded.diff == pytest.approx(0.0)
