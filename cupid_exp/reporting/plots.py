"""Plots of per-instance records: by type, by relevant position (paper Fig. 3), by history length (Fig. 9). Each returns
a Figure on the Agg canvas (no pyplot state: safe in workers); every number comes from ``cupid_exp.scoring``."""

from __future__ import annotations

import bisect
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cupid_exp.data.schema import INSTANCE_TYPES
from cupid_exp.reporting.runs import common_policy, row_labels
from cupid_exp.scoring.bootstrap import bootstrap_ci
from cupid_exp.scoring.statistics import HEADLINE, TASK_METRICS, fields_of, task_frame, task_of

if TYPE_CHECKING:
    from cupid_exp.reporting.selection import Selection

log = logging.getLogger(__name__)

Records = Sequence[Mapping[str, Any]]
Series = Records | Mapping[str, Records]

LABELS = {"precision": "precision", "recall": "recall", "f1": "F1 (HM of mean P and mean R)",
          "score": "judge score (1–10)"}
ALIASES = {"judge_score": "score"}  # the record field's name for the statistic
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf"]


def _series(records: Series) -> dict[str, list[Mapping[str, Any]]]:
    return {str(k): list(v) for k, v in records.items()} if isinstance(records, Mapping) else {"": list(records)}


def _metric(metric: str) -> str:
    """The statistic a metric name a plot accepts stands for."""
    metric = ALIASES.get(metric, metric)
    if task_of(metric) is None:
        raise ValueError(f"metric={metric!r}; expected one of {[m for ms in TASK_METRICS.values() for m in ms]}")
    return metric


def _figure(width: float = 7.5, height: float = 4.5) -> Figure:
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _empty(fig: Figure, title: str, message: str) -> Figure:
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, transform=ax.transAxes, color="0.35")
    return fig


def _errorbar(est, scale: float) -> tuple[float, float]:
    if math.isnan(est.low):
        return 0.0, 0.0
    return max(0.0, (est.value - est.low) * scale), max(0.0, (est.high - est.value) * scale)


def plot_by_type(records: Series, task: str = "inference", *, metric: str | None = None, n_boot: int = 1000,
                 seed: int = 0, failure_policy: str = "exclude", title: str | None = None) -> Figure:
    """Bars per instance type with 95% cluster-bootstrap intervals (P, R, F1 for one inference run)."""
    series = _series(records)
    metric = _metric(metric or HEADLINE[task])
    present = {r.get("instance_type") for recs in series.values() for r in recs}
    groups = ["all", *[t for t in INSTANCE_TYPES if t in present]]
    single = len(series) == 1
    metrics = list(TASK_METRICS["inference"]) if (single and task == "inference" and metric == "f1") else [metric]
    bars = [(label, m) for label in series for m in metrics]
    fig = _figure(max(6.5, 1.6 + 0.55 * len(groups) * len(bars)), 4.6)
    title = title or f"{task}: {LABELS.get(metric, metric) if len(metrics) == 1 else 'P / R / F1'} by instance type" \
                     f" (95% cluster-bootstrap CI)"
    if not any(series.values()):
        return _empty(fig, title, "no instances")
    ax = fig.add_subplot()
    width = 0.8 / len(bars)
    x = np.arange(len(groups))
    scale = 1.0 if metric == "score" else 100.0  # a judge score as it is, P/R/F1 in %
    scored: dict[str, list[int]] = {}  # series -> instances entering ``metric`` per group
    for j, (label, m) in enumerate(bars):
        recs = series[label]
        ests = [bootstrap_ci(recs if g == "all" else [r for r in recs if r.get("instance_type") == g], m,
                             n_boot=n_boot, seed=seed, failure_policy=failure_policy) for g in groups]
        if m == metric:
            scored[label] = [e.n for e in ests]
        values = [0.0 if math.isnan(e.value) else e.value * scale for e in ests]
        err = np.array([_errorbar(e, scale) for e in ests]).T
        name = label if not single else m
        if single and len(metrics) == 1:
            name = LABELS.get(m, m)
        pos = x - 0.4 + width * (j + 0.5)
        ax.bar(pos, values, width * 0.92, yerr=err, capsize=3, label=name, color=COLORS[j % len(COLORS)],
               error_kw={"elinewidth": 1, "ecolor": "0.25"})
        for xi, e, v, up in zip(pos, ests, values, err[1], strict=False):
            text = "n/a" if math.isnan(e.value) else (f"{v:.1f}" if scale == 100 else f"{v:.2f}")
            ax.annotate(text, (xi, v + up), xytext=(0, 2), textcoords="offset points", ha="center",
                        va="bottom", fontsize=7, color="0.2")
    ax.set_xticks(x, [f"{g}\n(n={ns[0] if len(set(ns)) == 1 else '/'.join(map(str, ns))})"
                      for g, ns in zip(groups, zip(*scored.values(), strict=True), strict=True)])
    ax.set_ylim(0.0, 105.0 if scale == 100 else 10.5)
    ax.set_ylabel(("% " if scale == 100 else "") + LABELS.get(metric, metric) if len(metrics) == 1 else "% (macro)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", ncols=min(len(bars), 4), frameon=False)
    return fig


def _binned_plot(series: dict[str, list[Mapping[str, Any]]], metric: str, bins: list[tuple[float, str]],
                 assign, *, n_boot: int, seed: int, failure_policy: str, title: str, xlabel: str,
                 footnote: str, missing: str) -> Figure:
    """Shared body: one line per series through the per-bin statistic, CI bars, n per point. ``bins``: (x, tick
    label), one unit apart (both callers number them 0, 1, ... or k + 0.5), which the jitter and dodge are scaled to.
    A record ``assign`` puts in no bin lacks ``missing``: the footnote counts them."""
    fig = _figure(7.5, 4.6)
    ax = fig.add_subplot()
    scale = 1.0 if metric == "score" else 100.0  # a judge score as it is, P/R/F1 in %
    task = task_of(metric)
    field = "f1" if metric == "f1" else fields_of(metric)[0]  # the dots behind the statistic (F1: each instance's)
    rng = np.random.default_rng(seed)
    left_out = 0
    for j, (label, recs) in enumerate(series.items()):
        color = COLORS[j % len(COLORS)]
        members: list[list[Mapping[str, Any]]] = [[] for _ in bins]
        for r in recs:  # each record's bin found once
            b = assign(r)
            if b is not None:
                members[b].append(r)
        left_out += len(recs) - sum(map(len, members))
        ests = [(x, est) for (x, _), part in zip(bins, members, strict=False)
                if (est := bootstrap_ci(part, metric, n_boot=n_boot, seed=seed, failure_policy=failure_policy)).n]
        xs, ys, ns = [x for x, _ in ests], [est.value * scale for _, est in ests], [est.n for _, est in ests]
        lo, hi = ([_errorbar(est, scale)[side] for _, est in ests] for side in (0, 1))
        if len(series) == 1:  # each instance's own value as a faint dot
            px, py = [], []
            for (x, _), part in zip(bins, members, strict=False):
                frame = task_frame(part, task, failure_policy)  # the instances the statistic is over
                for v in (frame[field].dropna() if field in frame else []):
                    px.append(x + rng.uniform(-0.12, 0.12))
                    py.append(float(v) * scale)
            ax.scatter(px, py, s=9, color="0.6", alpha=0.45, linewidths=0, label="instances", zorder=1)
        if len(series) > 1 and len(bins) > 1:  # dodge the series a little so their bars do not overlap
            xs = [x + 0.06 * (j - (len(series) - 1) / 2) for x in xs]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, color=color, lw=1.6, zorder=3,
                    label=label or LABELS.get(metric, metric))
        for x, y, n in zip(xs, ys, ns, strict=False):
            ax.annotate(f"n={n}", (x, y), xytext=(4, 5), textcoords="offset points", fontsize=7, color=color)
    ax.set_xticks([b[0] for b in bins], [b[1] for b in bins], fontsize=8)
    ax.set_ylim(0.0, 105.0 if scale == 100 else 10.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(("% " if scale == 100 else "") + LABELS.get(metric, metric))
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False, loc="best")
    footnote += f"; {left_out} instance(s) without {missing} left out" if left_out else ""
    ax.annotate(footnote, (0, 0), xycoords="axes fraction", xytext=(0, -38), textcoords="offset points",
                fontsize=7, color="0.4", ha="left", va="top", annotation_clip=False)
    return fig


def _mean_position(r: Mapping[str, Any]) -> float | None:
    pos = r.get("relevant_positions")
    return float(np.mean(pos)) if isinstance(pos, (list, tuple)) and pos else None


def plot_by_relevant_position(records: Series, metric: str = "f1", *, n_boot: int = 1000, seed: int = 0,
                              failure_policy: str = "exclude", title: str | None = None) -> Figure:
    """Score by mean position of the relevant sessions (paper Fig. 3); records without positions are footnoted."""
    series = _series(records)
    metric = _metric(metric)
    title = title or f"{LABELS[metric]} vs. where the relevant sessions are in the history"
    fig_args = dict(n_boot=n_boot, seed=seed, failure_policy=failure_policy)
    means = [m for recs in series.values() for r in recs if (m := _mean_position(r)) is not None]
    if not means:
        return _empty(_figure(), title, "no instance carries relevant_positions\n"
                                        "(runs from before they were recorded, or no relevant session found)")
    n_prior = [r.get("n_prior_sessions") for recs in series.values() for r in recs
               if isinstance(r.get("n_prior_sessions"), int)]
    first = int(math.floor(min(means)))
    last = int(math.floor(max(means)))
    bins = [(k + 0.5, f"{k}–{k + 1}" if k + 1 <= (max(n_prior) if n_prior else last + 1) else f"{k}")
            for k in range(first, last + 1)]

    def assign(r: Mapping[str, Any]) -> int | None:
        m = _mean_position(r)
        return None if m is None else int(math.floor(m)) - first

    hist = (f"histories of {min(n_prior)}–{max(n_prior)} sessions; " if n_prior and min(n_prior) != max(n_prior)
            else f"histories of {n_prior[0]} sessions; " if n_prior else "")
    return _binned_plot(series, metric, bins, assign, title=title, footnote=f"{hist}1 = oldest session",
                        missing="relevant positions",
                        xlabel="mean position of the relevant sessions (bins of one session)", **fig_args)


def plot_by_history_length(records: Series, metric: str = "f1", *, n_bins: int = 5, n_boot: int = 1000,
                           seed: int = 0, failure_policy: str = "exclude", title: str | None = None) -> Figure:
    """Score against history length in words, in ``n_bins`` quantile bins shared by all runs (paper Fig. 9)."""
    series = _series(records)
    metric = _metric(metric)
    title = title or f"{LABELS[metric]} vs. history length (equal-size bins)"
    words = sorted(float(r["history_words"]) for recs in series.values() for r in recs
                   if isinstance(r.get("history_words"), (int, float)))
    if not words:
        return _empty(_figure(), title, "no instance carries history_words")
    # equal-size bins over all instances pooled (several runs of the same data share the same bins)
    chunks = [c for c in np.array_split(np.array(words), max(1, min(n_bins, len(words)))) if len(c)]
    uppers = [float(c[-1]) for c in chunks]
    bins = [(float(i), f"{c[0] / 1000:.1f}k–{c[-1] / 1000:.1f}k" if c[-1] >= 10_000 else f"{c[0]:.0f}–{c[-1]:.0f}")
            for i, c in enumerate(chunks)]

    def assign(r: Mapping[str, Any]) -> int | None:
        w = r.get("history_words")
        return min(bisect.bisect_left(uppers, w), len(uppers) - 1) if isinstance(w, (int, float)) else None

    sizes = sorted({len(c) // max(1, len(series)) for c in chunks})
    size = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}"
    return _binned_plot(series, metric, bins, assign, n_boot=n_boot, seed=seed, failure_policy=failure_policy,
                        title=title, xlabel="history length (words in the prior sessions)", missing="history_words",
                        footnote=f"{len(chunks)} bins of {size} instances by words in the prior sessions")


def save_run_plots(records: Sequence[Mapping[str, Any]], parts: Sequence[str] | str, out_dir: str | Path, *,
                   n_boot: int = 1000, seed: int = 0, failure_policy: str = "exclude",
                   title_prefix: str = "") -> list[Path]:
    """Write one run's plots as PNGs into ``out_dir`` (those lacking data skipped, logged); returns the paths."""
    names = [parts] if isinstance(parts, str) else list(parts)
    if any(p not in TASK_METRICS for p in names):
        raise ValueError(f"parts={parts!r}; expected parts from {sorted(TASK_METRICS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = list(records)
    kw = dict(n_boot=n_boot, seed=seed, failure_policy=failure_policy)
    prefix = f"{title_prefix}: " if title_prefix else ""
    written: list[Path] = []
    for t in names:
        metric = HEADLINE[t]
        if task_frame(records, t, failure_policy).empty:
            log.info("no scored %s instances: no %s plots", t, t)
            continue
        figures = {f"{t}_by_type": plot_by_type(records, t, title=f"{prefix}{t} by instance type "
                                                                  f"(95% cluster-bootstrap CI)", **kw)}
        if any(_mean_position(r) is not None for r in records):
            figures[f"{t}_by_position"] = plot_by_relevant_position(
                records, metric, title=f"{prefix}{LABELS[metric]} vs. position of the relevant sessions", **kw)
        else:
            log.info("records carry no relevant_positions: %s_by_position skipped", t)
        if any(r.get("history_words") is not None for r in records):
            figures[f"{t}_by_history_length"] = plot_by_history_length(
                records, metric, title=f"{prefix}{LABELS[metric]} vs. history length", **kw)
        else:
            log.info("records carry no history_words: %s_by_history_length skipped", t)
        for name, fig in figures.items():
            written.append(out / f"{name}.png")
            fig.savefig(written[-1])
    return written


def report_figures(selection: "Selection", *, n_boot: int = 1000, seed: int = 0
                   ) -> Iterator[tuple[str, str, Figure]]:
    """Cross-model figures (standard setting) per data set × evaluator × task, as (file stem, caption, figure)."""
    pairs = {(r.data_id, r.evaluator) for r in selection.runs}
    for data, evaluator in sorted(pairs, key=lambda pair: (pair[0].label, pair[1])):
        for task in TASK_METRICS:
            runs = [r for r in selection.runs if r.data_id == data and r.evaluator == evaluator
                    and r.setting == "standard" and task in r.tasks and selection.records.get(r.run_id)]
            if not runs:
                continue
            labels = row_labels(runs)  # a model that ran in several ways: a series for each
            series = {labels[r.run_id]: selection.records[r.run_id] for r in runs}
            kw = dict(n_boot=n_boot, seed=seed, failure_policy=common_policy(runs))
            metric = HEADLINE[task]
            figures = {"by_type": plot_by_type(series, task, **kw),
                       "by_position": plot_by_relevant_position(series, metric, **kw),
                       "by_history_length": plot_by_history_length(series, metric, **kw)}
            for name, fig in figures.items():
                yield (f"{data.slug}_{evaluator}_{task}_{name}",
                       f"{task} {name.replace('_', ' ')}: data={data.label}, evaluator={evaluator}", fig)


def save_report_plots(selection: "Selection", out_dir: Path, *, n_boot: int = 1000, seed: int = 0) -> list[Path]:
    """``report_figures`` as PNG files in ``out_dir`` (a sweep's plots, logged on its parent run)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, _, fig in report_figures(selection, n_boot=n_boot, seed=seed):
        written.append(out_dir / f"{stem}.png")
        fig.savefig(written[-1])
    return written
