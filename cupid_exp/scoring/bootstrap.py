"""Seeded cluster bootstrap over personas, and paired comparisons: a persona's three instances share one history, so
intervals resample personas (then epochs) and tests permute within them, around ``scoring.statistics``'s numbers."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from cupid_exp.data.schema import INSTANCE_TYPES
from cupid_exp.scoring.names import metric_key
from cupid_exp.scoring.statistics import TASK_METRICS, fields_of, task_frame, task_of

DEFAULT_N_BOOT = 2000
DEFAULT_N_PERM = 10000
MAX_EXACT_PERSONAS = 12  # up to 2**12 sign patterns are enumerated exactly


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap interval, on the metric's own scale (P/R/F1 in 0–1)."""

    metric: str
    value: float
    low: float
    high: float
    n: int  # instances that entered the estimate
    n_clusters: int  # personas
    level: float = 0.95
    n_boot: int = DEFAULT_N_BOOT
    seed: int = 0

    def fmt(self, scale: float = 1.0, digits: int = 1) -> str:
        """'43.0 [39.8–46.1]' (scale=100 for percentages)."""
        if math.isnan(self.value):
            return "–"
        v = f"{self.value * scale:.{digits}f}"
        if math.isnan(self.low) or math.isnan(self.high):
            return v
        return f"{v} [{self.low * scale:.{digits}f}–{self.high * scale:.{digits}f}]"


@dataclass(frozen=True)
class Comparison:
    """B minus A on the instances both runs scored (paired by instance key)."""

    metric: str
    a: float
    b: float
    diff: float  # b - a
    low: float
    high: float
    p_value: float  # two-sided sign-flip permutation test, persona level
    p_exact: bool  # True when every sign pattern was enumerated
    n_shared: int
    n_clusters: int
    only_a: int  # instances scored in A but not in B (left out of the comparison)
    only_b: int
    level: float = 0.95
    n_boot: int = DEFAULT_N_BOOT
    seed: int = 0


@dataclass(frozen=True)
class _Clusters:
    """Per-persona sums and counts of the fields a statistic needs."""

    ids: tuple[str, ...]
    sums: dict[str, np.ndarray]  # field -> (n_clusters,)
    counts: dict[str, np.ndarray]  # field -> (n_clusters,)

    @property
    def n(self) -> int:
        return len(self.ids)


def _rows(records: Sequence[Mapping[str, Any]], metric: str, failure_policy: str) -> pd.DataFrame:
    """The rows that enter ``metric`` (zero-filled failures where the policy says so)."""
    task = task_of(metric)
    if task is not None:
        return task_frame(records, task, failure_policy)
    frame = pd.DataFrame(list(records))
    if frame.empty or metric not in frame:
        return pd.DataFrame()
    values = pd.to_numeric(frame[metric].where(frame[metric].map(lambda v: not isinstance(v, bool))),
                           errors="coerce")
    return frame[values.notna()].assign(**{metric: values[values.notna()]})


def _clusters(rows: pd.DataFrame, fields: Sequence[str], cluster: str, ids: Sequence[str] | None = None
              ) -> _Clusters:
    """Per-cluster sums and counts of ``fields`` over ``rows`` (every row enters: the policy already ran)."""
    if rows.empty:
        ids = list(ids or [])
        return _Clusters(tuple(ids), {f: np.zeros(len(ids)) for f in fields}, {f: np.zeros(len(ids)) for f in fields})
    keys = (rows[cluster] if cluster in rows else rows["key"]).astype(str)
    values = rows[list(fields)].apply(pd.to_numeric, errors="coerce").astype(float)
    grouped = values.groupby(keys.to_numpy())
    ids = sorted(set(keys)) if ids is None else list(ids)
    sums, counts = grouped.sum().reindex(ids, fill_value=0.0), grouped.count().reindex(ids, fill_value=0)
    return _Clusters(tuple(ids), {f: sums[f].to_numpy(dtype=float) for f in fields},
                     {f: counts[f].to_numpy(dtype=float) for f in fields})


def _epoch_cells(rows: pd.DataFrame, cluster: str, personas: Sequence[str] | None = None
                 ) -> tuple[pd.DataFrame, str, list[str] | None, int]:
    """With several epochs: the rows with a (persona, epoch) cell column, its name, the cells persona-major and the
    epoch count; else the plain persona bootstrap's inputs."""
    if rows.empty or "epoch" not in rows or rows["epoch"].nunique(dropna=True) < 2:
        return rows, cluster, (list(personas) if personas is not None else None), 1
    epochs = sorted(rows["epoch"].dropna().astype(int).unique())
    owner = (rows[cluster] if cluster in rows else rows["key"]).astype(str)
    cells = owner + "\x1f" + rows["epoch"].astype(int).astype(str)
    personas = sorted(set(owner)) if personas is None else list(personas)
    ids = [f"{p}\x1f{e}" for p in personas for e in epochs]
    return rows.assign(_cell=cells), "_cell", ids, len(epochs)


def _from_totals(metric: str, sums: Mapping[str, np.ndarray], counts: Mapping[str, np.ndarray]) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        means = {f: sums[f] / counts[f] for f in fields_of(metric)}
        if metric == "f1":
            p, r = means["precision"], means["recall"]
            return np.where(p + r > 0, 2 * p * r / (p + r), np.where(np.isnan(p + r), np.nan, 0.0))
        return means[fields_of(metric)[0]]


def _scored_clusters(cl: _Clusters, n_epochs: int = 1) -> _Clusters:
    """Only personas with a scored instance; with epochs, every cell of such a persona."""
    first = next(iter(cl.counts))
    keep = np.repeat(cl.counts[first].reshape(-1, n_epochs).sum(axis=1) > 0, n_epochs)
    return _Clusters(tuple(c for c, k in zip(cl.ids, keep, strict=False) if k),
                     {f: v[keep] for f, v in cl.sums.items()}, {f: v[keep] for f, v in cl.counts.items()})


def _statistic(metric: str, cl: _Clusters, weights: np.ndarray) -> np.ndarray:
    """The statistic for each row of ``weights`` (resamples x clusters: how often each persona is drawn)."""
    fields = fields_of(metric)
    return _from_totals(metric, {f: weights @ cl.sums[f] for f in fields},
                        {f: weights @ cl.counts[f] for f in fields})


def _percentiles(samples: np.ndarray, level: float) -> tuple[float, float]:
    samples = samples[~np.isnan(samples)]
    if samples.size == 0:
        return math.nan, math.nan
    alpha = (1 - level) / 2
    lo, hi = np.quantile(samples, [alpha, 1 - alpha])
    return float(lo), float(hi)


def _epoch_weights(n_clusters: int, n_epochs: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """n_boot x (n_clusters * n_epochs) counts: personas drawn with replacement, then each draw's epochs; cell
    (b, i) counts how often persona i (its epoch) was drawn in resample b. With one epoch the epoch draw is all 0
    and takes no bits from ``rng`` (an empty range), so the weights are the plain persona bootstrap's. A resample at a
    time, its epochs drawn in turn (the same draws as one call): no n_boot x width temporaries (~60 MB at 756)."""
    personas = rng.integers(0, n_clusters, size=(n_boot, n_clusters))
    width = n_clusters * n_epochs
    weights = np.empty((n_boot, width))
    for row, drawn in enumerate(personas):
        cells = drawn[:, None] * n_epochs + rng.integers(0, n_epochs, size=(n_clusters, n_epochs))  # (persona, epoch)
        weights[row] = np.bincount(cells.ravel(), minlength=width)
    return weights


@functools.lru_cache(maxsize=8)
def _seeded_weights(n_clusters: int, n_boot: int, seed: int, n_epochs: int = 1) -> np.ndarray:
    """``_epoch_weights`` at ``seed``, made once for every metric and plot asking the same (read-only)."""
    weights = _epoch_weights(n_clusters, n_epochs, n_boot, np.random.default_rng(seed))
    weights.setflags(write=False)
    return weights


def _scored(records: Iterable[Mapping[str, Any]], metric: str, cluster: str, failure_policy: str
            ) -> tuple[_Clusters, int]:
    """The clusters an interval resamples (with epochs, each persona's epochs as cells) and the epoch count."""
    rows, cell, ids, k = _epoch_cells(_rows(list(records), metric, failure_policy), cluster)
    return _scored_clusters(_clusters(rows, fields_of(metric), cell, ids), k), k


def bootstrap_distribution(records: Sequence[Mapping[str, Any]], metric: str, *, n_boot: int = DEFAULT_N_BOOT,
                           seed: int = 0, cluster: str = "persona_id",
                           failure_policy: str = "exclude") -> np.ndarray:
    """The ``n_boot`` resampled values of ``metric`` (for tests and plots)."""
    cl, k = _scored(records, metric, cluster, failure_policy)
    return _statistic(metric, cl, _seeded_weights(cl.n // k, n_boot, seed, k)) if cl.n else np.full(n_boot, np.nan)


def point_estimate(records: Sequence[Mapping[str, Any]], metric: str, *, cluster: str = "persona_id",
                   failure_policy: str = "exclude") -> float:
    cl = _clusters(_rows(list(records), metric, failure_policy), fields_of(metric), cluster)
    return float(_statistic(metric, cl, np.ones((1, cl.n)))[0]) if cl.n else math.nan


def bootstrap_ci(records: Iterable[Mapping[str, Any]], metric: str, *, n_boot: int = DEFAULT_N_BOOT,
                 seed: int = 0, level: float = 0.95, cluster: str = "persona_id",
                 failure_policy: str = "exclude") -> Estimate:
    """Point estimate and cluster-bootstrap percentile interval of ``metric`` over ``records``."""
    cl, k = _scored(records, metric, cluster, failure_policy)
    n = int(cl.counts[fields_of(metric)[0]].sum())
    n_clusters = cl.n // k
    if n == 0:
        return Estimate(metric, math.nan, math.nan, math.nan, 0, 0, level, n_boot, seed)
    value = float(_statistic(metric, cl, np.ones((1, cl.n)))[0])
    weights = _seeded_weights(n_clusters, n_boot, seed, k)
    low, high = _percentiles(_statistic(metric, cl, weights), level)
    return Estimate(metric, value, low, high, n, n_clusters, level, n_boot, seed)


def _by_type(records: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    return {"all": list(records)} | {itype: part for itype in INSTANCE_TYPES
                                     if (part := [r for r in records if r.get("instance_type") == itype])}


def task_cis(records: Iterable[Mapping[str, Any]], task: str, *, n_boot: int = DEFAULT_N_BOOT, seed: int = 0,
             failure_policy: str = "exclude") -> dict[str, dict[str, Estimate]]:
    """{'all': {'precision': Estimate, ...}, 'consistent': {...}, ...} for ``task`` inference or generation."""
    return {group: {m: bootstrap_ci(part, m, n_boot=n_boot, seed=seed, failure_policy=failure_policy)
                    for m in TASK_METRICS[task]} for group, part in _by_type(list(records)).items()}


def ci_metrics(records: Iterable[Mapping[str, Any]], parts: Sequence[str], *, n_boot: int = DEFAULT_N_BOOT,
               seed: int = 0, failure_policy: str = "exclude") -> dict[str, float]:
    """Flat MLflow metrics for a job's task ``parts``: '<task>/f1/ci_low', '<task>/changing/score/ci_high', ..."""
    records = list(records)
    out: dict[str, float] = {}
    for t in parts:
        for group, block in task_cis(records, t, n_boot=n_boot, seed=seed, failure_policy=failure_policy).items():
            for m, est in block.items():
                if est.n:
                    out[metric_key(t, group, m, "ci_low")] = est.low
                    out[metric_key(t, group, m, "ci_high")] = est.high
    _seeded_weights.cache_clear()  # this job's: not held through the rest of it (12 MB at 756 personas)
    return {k: v for k, v in out.items() if v == v}


def _sign_patterns(n: int, n_perm: int, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    """Rows of 0/1: 1 = swap A and B for that persona. Exact enumeration when small."""
    if n <= MAX_EXACT_PERSONAS and 2 ** n <= max(n_perm, 2):
        return np.array(list(itertools.product((0, 1), repeat=n)), dtype=float), True
    return rng.integers(0, 2, size=(n_perm, n)).astype(float), False


def paired_compare(records_a: Iterable[Mapping[str, Any]], records_b: Iterable[Mapping[str, Any]], metric: str, *,
                   key: str = "key", cluster: str = "persona_id", n_boot: int = DEFAULT_N_BOOT,
                   n_perm: int = DEFAULT_N_PERM, seed: int = 0, level: float = 0.95,
                   failure_policy: str = "exclude") -> Comparison:
    """B − A on the instances both runs scored (paired by ``key``). The interval is a paired cluster bootstrap; the
    p-value a two-sided sign-flip permutation test within personas (exact up to ``MAX_EXACT_PERSONAS``)."""
    fields = fields_of(metric)

    records_a, records_b = list(records_a), list(records_b)
    epochs = any(r.get("epoch") is not None for r in records_a + records_b)

    def pair(row: pd.Series) -> str:  # with epochs, a run of one epoch has only epoch 0 to pair
        epoch = row.get("epoch")
        return f"{row[key]}#0" if epochs and (epoch is None or pd.isna(epoch)) else str(row[key])

    def scored(records: list[Mapping[str, Any]]) -> dict[str, pd.Series]:
        rows = _rows(records, metric, failure_policy)
        if rows.empty:
            return {}
        keys = [pair(row) for _, row in rows.iterrows()]
        if epochs:
            rows = rows.assign(epoch=rows["epoch"].fillna(0) if "epoch" in rows else 0)
        return dict(zip(keys, (row for _, row in rows.iterrows()), strict=True))

    a, b = scored(records_a), scored(records_b)
    shared = sorted(set(a) & set(b))
    ra, rb = pd.DataFrame([a[k] for k in shared]), pd.DataFrame([b[k] for k in shared])
    personas = sorted({str(a[k].get(cluster, k)) for k in shared})
    ra, cell, ids, n_epochs = _epoch_cells(ra, cluster, personas)
    rb = _epoch_cells(rb, cluster, personas)[0] if n_epochs > 1 else rb
    ca, cb = _clusters(ra, fields, cell, ids), _clusters(rb, fields, cell, ids)
    if not shared:
        nan = math.nan
        return Comparison(metric, nan, nan, nan, nan, nan, nan, False, 0, 0, len(a), len(b), level, n_boot, seed)
    ones = np.ones((1, len(ids)))
    va, vb = float(_statistic(metric, ca, ones)[0]), float(_statistic(metric, cb, ones)[0])
    diff = vb - va

    rng = np.random.default_rng(seed)
    weights = _epoch_weights(len(personas), n_epochs, n_boot, rng)  # the same personas and epochs for A and B
    low, high = _percentiles(_statistic(metric, cb, weights) - _statistic(metric, ca, weights), level)

    flips, exact = _sign_patterns(len(personas), n_perm, rng)
    flips = np.repeat(flips, n_epochs, axis=1)  # a persona's epochs trade places together
    # flip[j, i] = 1: persona i's A and B results trade places in permutation j
    keep = 1 - flips
    null = (_from_totals(metric, {f: keep @ cb.sums[f] + flips @ ca.sums[f] for f in fields},
                         {f: keep @ cb.counts[f] + flips @ ca.counts[f] for f in fields})
            - _from_totals(metric, {f: keep @ ca.sums[f] + flips @ cb.sums[f] for f in fields},
                           {f: keep @ ca.counts[f] + flips @ cb.counts[f] for f in fields}))
    extreme = int(np.sum(np.abs(null) >= abs(diff) - 1e-12))
    p_value = extreme / len(flips) if exact else (1 + extreme) / (1 + len(flips))
    return Comparison(metric, va, vb, diff, low, high, float(p_value), exact, len(shared), len(personas),
                      len(set(a) - set(b)), len(set(b) - set(a)), level, n_boot, seed)
