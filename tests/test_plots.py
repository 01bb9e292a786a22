"""Plots: right numbers in the right places, PNGs written, missing fields handled."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.container import BarContainer, ErrorbarContainer

from cupid_exp.plots import plot_by_history_length, plot_by_relevant_position, plot_by_type, save_run_plots
from cupid_exp.stats import point_estimate

TYPES = ("consistent", "contrastive", "changing")
PNG = b"\x89PNG\r\n\x1a\n"


def make_records(n_personas: int = 30, seed: int = 0, shift: float = 0.0, fail_every: int = 17,
                 generation: bool = True) -> list[dict]:
    """Records shaped like instances.jsonl lines, with the fields the plots use."""
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
    paths = save_run_plots(make_records(), "both", tmp_path / "plots", n_boot=100)
    names = sorted(p.name for p in paths)
    assert names == sorted(f"{t}_{k}.png" for t in ("inference", "generation")
                           for k in ("by_type", "by_position", "by_history_length"))
    for p in paths:
        data = p.read_bytes()
        assert data.startswith(PNG) and len(data) > 15_000  # a real chart, not a blank canvas


def test_save_run_plots_skips_what_the_records_cannot_show(tmp_path: Path) -> None:
    old = [{k: v for k, v in r.items() if k not in ("relevant_positions", "history_words")}
           for r in make_records(generation=False)]
    paths = save_run_plots(old, "both", tmp_path)
    assert [p.name for p in paths] == ["inference_by_type.png"]  # no positions, no lengths, no judge scores
    with pytest.raises(ValueError):
        save_run_plots(old, "ranking", tmp_path)


def test_empty_inputs_give_a_message_not_a_crash() -> None:
    fig = plot_by_relevant_position([{"key": "a", "persona_id": "a", "precision": 1.0, "recall": 1.0}])
    assert "no instance carries relevant_positions" in fig.axes[0].texts[0].get_text()
    fig = plot_by_type([], "inference")
    assert fig.axes[0].texts[0].get_text() == "no instances"
