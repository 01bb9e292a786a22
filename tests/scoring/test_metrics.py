"""Aggregation: macro (paper) and micro (upstream) P/R/F1, per type, and failed instances.

Expected values are computed by hand in the comments.
"""

from __future__ import annotations

import math

import pytest

from cupid_exp.scoring.summary import error_counts, flat_metrics, task_metrics


def rec(itype, pm, n_pred, tm, n_true, **extra):
    p, r = pm / n_pred, tm / n_true
    return {"key": f"x/{itype}", "instance_type": itype, "predicted_matched": pm, "n_predicted": n_pred,
            "true_matched": tm, "n_true": n_true, "precision": p, "recall": r,
            "f1": 0.0 if p + r == 0 else 2 * p * r / (p + r), "gt_checklist_len": n_true, "errors": [], **extra}


# A consistent:  P = 2/2 = 1.0,  R = 1/2 = 0.5,   F1 = 2/3
# B contrastive: P = 2/4 = 0.5,  R = 3/3 = 1.0,   F1 = 2/3
# C changing:    P = 1/4 = 0.25, R = 1/4 = 0.25,  F1 = 0.25
# D consistent:  P = 1/1 = 1.0,  R = 0/3 = 0.0,   F1 = 0
RECORDS = [
    rec("consistent", 2, 2, 1, 2),
    rec("contrastive", 2, 4, 3, 3),
    rec("changing", 1, 4, 1, 4),
    rec("consistent", 1, 1, 0, 3),
]
# failed at match_precision: as the task writes it, no precision/recall/n_predicted/n_true keys at all
FAILED = {"key": "y/changing", "instance_type": "changing", "gt_checklist_len": 3,
          "inferred_preference": "p", "inferred_checklist": ["a?", "b?"],
          "errors": [{"step": "match_precision", "kind": "unparseable", "message": "m"}]}


def test_macro_is_mean_of_instances_and_f1_is_harmonic_mean_of_means():
    m = task_metrics(RECORDS, "inference")["all"]
    assert m["n"] == 4
    # P = (1 + .5 + .25 + 1) / 4 = 0.6875 ; R = (.5 + 1 + .25 + 0) / 4 = 0.4375
    assert m["precision"] == pytest.approx(0.6875)
    assert m["recall"] == pytest.approx(0.4375)
    # F1 = 2 * .6875 * .4375 / 1.125 = 0.534722...
    assert m["f1"] == pytest.approx(0.6015625 / 1.125)
    # mean of per-instance F1 = (2/3 + 2/3 + .25 + 0) / 4 = 0.395833... -- NOT the headline F1
    assert m["mean_instance_f1"] == pytest.approx((4 / 3 + 0.25) / 4)
    assert not math.isclose(m["f1"], m["mean_instance_f1"], rel_tol=1e-3)


def test_micro_pools_matched_over_lengths():
    m = task_metrics(RECORDS, "inference")["all"]
    # P = (2+2+1+1)/(2+4+4+1) = 6/11 ; R = (1+3+1+0)/(2+3+4+3) = 5/12 ; F1 = 60/127
    assert m["micro/precision"] == pytest.approx(6 / 11)
    assert m["micro/recall"] == pytest.approx(5 / 12)
    assert m["micro/f1"] == pytest.approx(60 / 127)


def test_per_type_blocks():
    out = task_metrics(RECORDS, "inference")
    assert set(out) == {"all", "consistent", "contrastive", "changing", "counts"}
    cons = out["consistent"]
    # A and D: P = (1 + 1)/2 = 1 ; R = (.5 + 0)/2 = .25 ; F1 = 2*.25/1.25 = .4
    assert cons["n"] == 2
    assert cons["precision"] == pytest.approx(1.0)
    assert cons["recall"] == pytest.approx(0.25)
    assert cons["f1"] == pytest.approx(0.4)
    # micro: P = 3/3 ; R = 1/5 ; F1 = 2*.2/1.2 = 1/3
    assert cons["micro/precision"] == pytest.approx(1.0)
    assert cons["micro/recall"] == pytest.approx(0.2)
    assert cons["micro/f1"] == pytest.approx(1 / 3)
    assert out["contrastive"]["n"] == 1
    assert out["contrastive"]["f1"] == pytest.approx(2 / 3)
    assert out["changing"]["precision"] == pytest.approx(0.25)
    assert out["changing"]["f1"] == pytest.approx(0.25)
    assert out["counts"] == {"instances": 4, "scored": 4, "failed": 0, "zeroed": 0, "failure_policy": "exclude"}


def test_type_absent_from_records_has_no_block():
    out = task_metrics(RECORDS[:1], "inference")
    assert "consistent" in out and "contrastive" not in out and "changing" not in out


def test_exclude_drops_failed_record_and_counts_it():
    out = task_metrics(RECORDS + [FAILED], "inference", "exclude")
    assert out["all"]["n"] == 4
    assert out["all"]["precision"] == pytest.approx(0.6875)
    assert out["all"]["micro/recall"] == pytest.approx(5 / 12)
    assert out["changing"]["n"] == 1
    assert out["changing"]["precision"] == pytest.approx(0.25)
    assert out["counts"] == {"instances": 5, "scored": 4, "failed": 1, "zeroed": 0, "failure_policy": "exclude"}


def test_exclude_also_treats_explicit_none_precision_as_failed():
    failed = dict(FAILED, precision=None, recall=None, f1=None)
    out = task_metrics(RECORDS + [failed], "inference")
    assert out["counts"]["failed"] == 1
    assert out["all"]["recall"] == pytest.approx(0.4375)


def test_exclude_is_the_default_policy():
    assert task_metrics(RECORDS + [FAILED], "inference") == task_metrics(RECORDS + [FAILED], "inference", "exclude")


def test_zero_scores_failed_record_with_gt_length():
    out = task_metrics(RECORDS + [FAILED], "inference", "zero")
    m = out["all"]
    assert m["n"] == 5
    # macro P = (1 + .5 + .25 + 1 + 0)/5 = .55 ; R = (.5 + 1 + .25 + 0 + 0)/5 = .35
    assert m["precision"] == pytest.approx(0.55)
    assert m["recall"] == pytest.approx(0.35)
    assert m["f1"] == pytest.approx(2 * 0.55 * 0.35 / 0.9)
    assert m["mean_instance_f1"] == pytest.approx((4 / 3 + 0.25) / 5)
    # micro: n_true gets gt_checklist_len 3 -> R = 5/(12+3) = 1/3 ;
    # n_predicted comes from the failed record's inferred checklist (2 items) -> P = 6/(11+2)
    assert m["micro/recall"] == pytest.approx(5 / 15)
    assert m["micro/precision"] == pytest.approx(6 / 13)
    ch = out["changing"]
    # C and the failed one: P = (.25 + 0)/2, R = (.25 + 0)/2 ; micro R = 1/(4+3)
    assert ch["n"] == 2
    assert ch["precision"] == pytest.approx(0.125)
    assert ch["micro/recall"] == pytest.approx(1 / 7)
    assert out["counts"] == {"instances": 5, "scored": 4, "failed": 1, "zeroed": 1, "failure_policy": "zero"}


def test_zero_keeps_a_known_n_predicted():
    failed = dict(FAILED, n_predicted=2)  # e.g. a record that got as far as storing its checklist length
    m = task_metrics(RECORDS + [failed], "inference", "zero")["all"]
    assert m["micro/precision"] == pytest.approx(6 / 13)


def test_zero_with_every_record_failed():
    out = task_metrics([FAILED], "inference", "zero")
    assert out["all"]["n"] == 1
    assert out["all"]["precision"] == 0.0 and out["all"]["micro/recall"] == 0.0
    assert out["counts"]["failed"] == 1 and out["counts"]["scored"] == 0


def test_exclude_with_every_record_failed():
    out = task_metrics([FAILED], "inference", "exclude")
    assert out["all"] == {"n": 0}
    assert out["changing"] == {"n": 0}
    assert out["counts"]["failed"] == 1


def test_unknown_policy_raises():
    with pytest.raises(ValueError, match="drop"):
        task_metrics(RECORDS + [FAILED], "inference", "drop")


def test_no_records():
    out = task_metrics([], "inference")
    assert out["all"] == {"n": 0}
    assert out["counts"]["instances"] == 0


def test_flat_metrics_key_names():
    flat = flat_metrics("inference", task_metrics(RECORDS + [FAILED], "inference"))
    assert flat["inference/f1"] == pytest.approx(0.6015625 / 1.125)
    assert flat["inference/precision"] == pytest.approx(0.6875)
    assert flat["inference/n"] == 4.0
    assert flat["inference/micro/f1"] == pytest.approx(60 / 127)
    assert flat["inference/changing/f1"] == pytest.approx(0.25)
    assert flat["inference/consistent/micro/recall"] == pytest.approx(0.2)
    assert flat["inference/count/failed"] == 1.0
    assert flat["inference/count/scored"] == 4.0
    assert flat["inference/count/instances"] == 5.0
    assert "inference/count/failure_policy" not in flat  # not a number
    assert "inference/all/f1" not in flat
    assert all(isinstance(v, float) for v in flat.values())


def test_error_counts_per_step_and_kind():
    records = [
        {"errors": [{"step": "infer", "kind": "unparseable", "message": ""}]},
        {"errors": [{"step": "match_recall", "kind": "timeout", "message": ""},
                    {"step": "match_precision", "kind": "unparseable", "message": ""}]},
        {"errors": [{"step": "infer", "kind": "rate_limit", "message": ""}]},
        {"errors": [{"step": "infer", "kind": "unparseable", "message": ""}]},
        {"errors": []},
        {},
    ]
    assert error_counts(records) == {
        "infer": 3, "infer/unparseable": 2, "infer/rate_limit": 1,
        "match_recall": 1, "match_recall/timeout": 1,
        "match_precision": 1, "match_precision/unparseable": 1,
    }
    assert error_counts([]) == {}
