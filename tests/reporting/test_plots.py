"""Plots: right numbers in the right places, PNGs written, missing fields handled."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers.records import make_records
from matplotlib.container import BarContainer, ErrorbarContainer

from cupid_exp.reporting.plots import plot_by_history_length, plot_by_relevant_position, plot_by_type, save_run_plots
from cupid_exp.scoring.bootstrap import bootstrap_ci, point_estimate

PNG = b"\x89PNG\r\n\x1a\n"


def bar_heights(fig) -> list[list[float]]:
    ax = fig.axes[0]
    return [[p.get_height() for p in c] for c in ax.containers if isinstance(c, BarContainer)]


def line_points(fig) -> list[np.ndarray]:
    ax = fig.axes[0]
    return [c.lines[0].get_xydata() for c in ax.containers if isinstance(c, ErrorbarContainer)]


def test_by_type_bars_are_the_macro_numbers_per_type() -> None:
    records = make_records()
    fig = plot_by_type(records, "inference", n_boot=200)
    heights = bar_heights(fig)
    assert len(heights) == 3 and all(len(h) == 4 for h in heights)  # P, R, F1 x (all + 3 types)
    p_all, r_all, f1_all = (h[0] for h in heights)
    assert p_all == pytest.approx(100 * point_estimate(records, "precision"))
    assert r_all == pytest.approx(100 * point_estimate(records, "recall"))
    assert f1_all == pytest.approx(100 * point_estimate(records, "f1"))
    changing = [r for r in records if r["instance_type"] == "changing"]
    assert heights[2][3] == pytest.approx(100 * point_estimate(changing, "f1"))
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    n_scored_all = sum(r["precision"] is not None for r in records)
    assert labels[0] == f"all\n(n={n_scored_all})" and labels[3].startswith("changing")


def test_by_type_with_several_runs_has_one_bar_series_per_run() -> None:
    fig = plot_by_type({"gpt4o": make_records(seed=1), "claude37": make_records(seed=2, shift=0.2)}, "generation",
                       n_boot=100)
    heights = bar_heights(fig)
    assert len(heights) == 2 and heights[1][0] > heights[0][0]  # the shifted run scores higher
    assert fig.axes[0].get_ylim()[1] <= 10.5  # judge scores, not percentages
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["gpt4o", "claude37"]


def rec(persona: str, t: str, p: float, r: float, pos: list[int], words: int) -> dict:
    return {"key": f"{persona}/{t}", "persona_id": persona, "instance_type": t, "precision": p, "recall": r,
            "f1": 2 * p * r / (p + r), "relevant_positions": pos, "n_prior_sessions": 8, "history_words": words}


def test_position_plot_bins_by_mean_relevant_position() -> None:
    records = [rec("a", "consistent", 0.2, 0.4, [1, 2], 100),  # mean 1.5 -> bin [1, 2)
               rec("a", "changing", 0.4, 0.4, [1, 3], 200),  # mean 2.0 -> bin [2, 3)
               rec("b", "consistent", 0.6, 0.8, [2, 3], 300),  # mean 2.5 -> bin [2, 3)
               rec("b", "changing", 1.0, 1.0, [7, 8], 400),  # mean 7.5 -> bin [7, 8)
               {**rec("c", "consistent", 0.5, 0.5, [], 500), "relevant_positions": []}]  # left out
    fig = plot_by_relevant_position(records, "f1", n_boot=50)
    (points,) = line_points(fig)
    assert points[:, 0].tolist() == [1.5, 2.5, 7.5]
    hm = lambda p, r: 2 * p * r / (p + r)  # noqa: E731
    assert points[:, 1] == pytest.approx([100 * hm(0.2, 0.4), 100 * hm(0.5, 0.6), 100.0])
    assert "1 instance(s) without relevant positions left out" in " ".join(t.get_text() for t in fig.axes[0].texts)


def test_history_plot_uses_equal_size_bins() -> None:
    records = [rec(f"p{i}", "consistent", p=0.1 * (i + 1), r=0.1 * (i + 1), pos=[1, 2], words=1000 * (i + 1))
               for i in range(9)]
    fig = plot_by_history_length(records, "precision", n_bins=3, n_boot=50)
    (points,) = line_points(fig)
    assert points[:, 1] == pytest.approx([20.0, 50.0, 80.0])  # means of (.1,.2,.3), (.4,.5,.6), (.7,.8,.9)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["1000–3000", "4000–6000", "7000–9000"]
    assert "3 bins of 3 instances" in " ".join(t.get_text() for t in fig.axes[0].texts)
    annotations = [t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("n=")]
    assert annotations == ["n=3", "n=3", "n=3"]


def test_save_run_plots_writes_non_empty_pngs(tmp_path: Path) -> None:
    paths = save_run_plots(make_records(), ["inference", "generation"], tmp_path / "plots", n_boot=100)
    names = sorted(p.name for p in paths)
    assert names == sorted(f"{t}_{k}.png" for t in ("inference", "generation")
                           for k in ("by_type", "by_position", "by_history_length"))
    for p in paths:
        data = p.read_bytes()
        assert data.startswith(PNG) and len(data) > 15_000  # a real chart, not a blank canvas


def test_save_run_plots_skips_what_the_records_cannot_show(tmp_path: Path) -> None:
    old = [{k: v for k, v in r.items() if k not in ("relevant_positions", "history_words")}
           for r in make_records(generation=False)]
    paths = save_run_plots(old, ("inference", "generation"), tmp_path)
    assert [p.name for p in paths] == ["inference_by_type.png"]  # no positions, no lengths, no judge scores
    assert [p.name for p in save_run_plots(old, "inference", tmp_path / "one")] == ["inference_by_type.png"]
    with pytest.raises(ValueError):
        save_run_plots(old, "ranking", tmp_path)
    with pytest.raises(ValueError):  # a task name is not a list of parts
        save_run_plots(old, "both", tmp_path)


def test_empty_inputs_give_a_message_not_a_crash() -> None:
    fig = plot_by_relevant_position([{"key": "a", "persona_id": "a", "precision": 1.0, "recall": 1.0}])
    assert "no instance carries relevant_positions" in fig.axes[0].texts[0].get_text()
    fig = plot_by_type([], "inference")
    assert fig.axes[0].texts[0].get_text() == "no instances"


def failing(records: list[dict]) -> list[dict]:
    """``records`` where some instances failed at matching (after inferring) and some at inference."""
    out = [dict(r) for r in records]
    for i, r in enumerate(out):
        if r["errors"]:
            continue
        if i % 5 == 0:
            r.update(precision=None, recall=None, f1=None, inferred_checklist=["a", "b"], n_predicted=2,
                     errors=[{"step": "match_recall", "kind": "timeout", "message": "x"}])
    return out


@pytest.mark.parametrize("policy", ["exclude", "zero", "upstream"])
def test_plots_count_and_score_under_the_failure_policy(policy) -> None:
    records = failing(make_records())
    fig = plot_by_type(records, "inference", n_boot=50, failure_policy=policy)
    p_all, r_all, f1_all = (h[0] for h in bar_heights(fig))
    for bar, metric in ((p_all, "precision"), (r_all, "recall"), (f1_all, "f1")):
        assert bar == pytest.approx(100 * point_estimate(records, metric, failure_policy=policy))
    scored = sum(r["precision"] is not None for r in records)
    match_failed = sum(r["errors"] != [] and r["errors"][0]["step"] == "match_recall" for r in records)
    n = {"exclude": scored, "zero": len(records), "upstream": scored + match_failed}[policy]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()][0] == f"all\n(n={n})"
    assert len({bootstrap_ci(records, "f1", failure_policy=p).n for p in ("exclude", "zero", "upstream")}) == 3


def test_binned_dots_are_the_instances_the_statistic_is_over() -> None:
    records = failing(make_records(n_personas=10, fail_every=1000))
    zero_dots = plot_by_history_length(records, "f1", n_boot=20, failure_policy="zero").axes[0].collections[0]
    exclude_dots = plot_by_history_length(records, "f1", n_boot=20).axes[0].collections[0]
    failed = sum(r["precision"] is None for r in records)
    assert failed and len(zero_dots.get_offsets()) == len(exclude_dots.get_offsets()) + failed
    assert sorted(zero_dots.get_offsets()[:, 1])[:failed] == [0.0] * failed  # a zeroed instance sits at 0


def test_judge_score_is_an_alias_and_other_fields_are_refused() -> None:
    records = make_records()
    (alias,) = line_points(plot_by_history_length(records, "judge_score", n_boot=20))
    (score,) = line_points(plot_by_history_length(records, "score", n_boot=20))
    assert alias.tolist() == score.tolist()
    with pytest.raises(ValueError, match="metric='history_words'"):
        plot_by_history_length(records, "history_words")
