"""Which runs a report uses: finished and complete ones, the latest of each model × setting variant × task."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from cupid_exp.reporting.runs import JobRun
from cupid_exp.scoring.names import metric_key
from cupid_exp.scoring.statistics import HEADLINE

Records = list[dict[str, Any]]


@dataclass
class Selection:
    """The runs a report uses, their records (None: no instances.jsonl), and what it left out and why."""

    runs: list[JobRun]
    records: dict[str, Records | None]
    notes: list[str] = field(default_factory=list)


def partial_reason(run: JobRun, records: Records | None) -> str | None:
    """Why a finished run cannot stand for its configuration (tagged partial, no numbers, records missing)."""
    if run.tags.get("cupid.partial", "").lower() == "true":
        return "tagged cupid.partial"
    if not run.tasks:
        return f"no headline metric ({' / '.join(metric_key(t, 'all', m) for t, m in HEADLINE.items())})"
    if records is not None:
        for task in run.tasks:
            expected = run.instances(task)
            if expected is not None and len(records) < expected:
                return f"instances.jsonl holds {len(records)} of {int(expected)} instances"
    return None


def select_runs(runs: Sequence[JobRun], load: Callable[[str], Records | None]) -> Selection:
    """Keep finished, complete runs; for each (data, evaluator, model, setting label, task) the latest one.

    ``load(run_id)`` returns a run's records or None.
    """
    notes: list[str] = []
    records: dict[str, Records | None] = {}
    usable: list[JobRun] = []
    for run in runs:
        if run.status != "FINISHED":
            notes.append(f"skipped run {run.short} ({run.model}, {run.setting_label}): status {run.status}")
            continue
        recs = load(run.run_id)
        reason = partial_reason(run, recs)
        if reason:
            notes.append(f"skipped partial run {run.short} ({run.model}, {run.setting_label}): {reason}")
            continue
        if recs is None:
            notes.append(f"run {run.short} ({run.model}, {run.setting_label}) has no instances.jsonl artifact: "
                         f"its numbers have no confidence interval")
        records[run.run_id] = recs
        usable.append(run)
    latest: dict[tuple[str, ...], list[JobRun]] = {}
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
