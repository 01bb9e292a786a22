"""Which runs a report uses: finished, complete ones, one per experiment, the whole data set's before a subset's."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from cupid_exp.reporting.data_identity import one_name_per_content
from cupid_exp.reporting.runs import JobRun
from cupid_exp.run_outcomes import OUTCOME_TAG, REASON_TAG, description
from cupid_exp.scoring.names import metric_key
from cupid_exp.scoring.statistics import HEADLINE

Records = list[dict[str, Any]]


@dataclass
class Selection:
    """The runs a report uses, their records (None: no instances.jsonl), and what it left out and why."""

    runs: list[JobRun]
    records: dict[str, Records | None]
    notes: list[str] = field(default_factory=list)
    unfinished: list[JobRun] = field(default_factory=list)  #: failed, killed or still running: a table of their own


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


def _preference(run: JobRun) -> tuple[bool, int]:
    """Complete before incomplete, then the latest: what stands for an experiment."""
    return run.complete, run.start_time


def _why_not(run: JobRun, chosen: JobRun) -> str:
    """Why ``run`` does not stand for the experiment ``chosen`` stands for."""
    if run.subset and not chosen.subset:
        return f"a subset, {run.subset}; --subsets shows it as its own row"
    if not run.complete and chosen.complete:
        return "incomplete (tag cupid.complete=false)"
    return "older"


def _pick(group: list[JobRun], show_subsets: bool) -> tuple[list[JobRun], str | None]:
    """The runs one experiment shows (full data's best, subsets as own rows when asked or alone), with a note."""
    full = sorted((r for r in group if not r.subset), key=_preference, reverse=True)
    by_subset: dict[str, list[JobRun]] = {}
    for run in sorted((r for r in group if r.subset), key=_preference, reverse=True):
        by_subset.setdefault(run.subset, []).append(run)
    chosen = full[:1] + ([runs[0] for runs in by_subset.values()] if show_subsets or not full else [])
    if len(group) == 1:
        return chosen, None
    lead = chosen[0]
    latest = max(group, key=lambda r: r.start_time)
    using = (f"using the latest, {lead.short} ({lead.started})" if lead is latest else
             f"using {lead.short} ({lead.started}), the latest complete run on the "
             f"{'same subset' if lead.subset else 'whole data set'}")
    also = [f"{r.short} ({r.subset})" for r in chosen[1:]]

    def shown_instead(run: JobRun) -> JobRun:
        best = by_subset.get(run.subset, [lead])[0]
        return best if best in chosen else lead

    unused = [f"{r.short} ({r.started}; {_why_not(r, shown_instead(r))})"
              for r in sorted(group, key=lambda r: r.start_time, reverse=True) if r not in chosen]
    note = (f"{len(group)} runs; {using}" + (f"; also shown as their own rows: {', '.join(also)}" if also else "")
            + (f"; not used: {', '.join(unused)}" if unused else ""))
    return chosen, note


def select_runs(runs: Sequence[JobRun], load: Callable[[str], Records | None], *,
                show_subsets: bool = False) -> Selection:
    """Finished, complete runs, one per identity × task × data (the newest, the whole data set first); subsets as their
    own rows when ``show_subsets`` or alone. ``load(run_id)`` returns records or None."""
    notes: list[str] = []
    records: dict[str, Records | None] = {}
    usable: list[JobRun] = []
    unfinished: list[JobRun] = []
    for run in runs:
        if run.status != "FINISHED":
            notes.append(f"skipped run {run.short} ({run.model}, {run.setting_label}): status {run.status}, "
                         f"data={run.data_label}" + (f"; {ended(run)}" if ended(run) else ""))
            unfinished.append(run)
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
    named = one_name_per_content([run.data_id for run in usable])
    for run in usable:
        run.data_id = named[run.data_id]  # one label for one content, whatever path reached it
    experiments: dict[tuple[str, ...], list[JobRun]] = {}
    for run in sorted(usable, key=lambda r: r.start_time, reverse=True):
        for task in run.tasks:
            key = (run.data_id.full.label, run.evaluator, run.model, run.setting_label, task,
                   json.dumps(run.identity, sort_keys=True))
            experiments.setdefault(key, []).append(run)
    chosen: dict[str, JobRun] = {}
    for (data, evaluator, model, setting, task, _), group in sorted(experiments.items()):
        picked, note = _pick(group, show_subsets)
        chosen.update((r.run_id, r) for r in picked)
        if note:
            notes.append(f"{model} × {setting} ({task}, data={data}, evaluator={evaluator}): {note}")
    for run in chosen.values():
        if run.subset:
            notes.append(f"run {run.short} ({run.model}, {run.setting_label}) covers a subset, {run.subset}: "
                         f"its own row, under data={run.data_label}")
        if not run.complete:
            notes.append(f"run {run.short} ({run.model}, {run.setting_label}) is incomplete (tag cupid.complete="
                         f"false): its failed instances are left out or scored by its policy, {run.failure_policy}")
    kept = [r for r in usable if r.run_id in chosen]
    return Selection(kept, {r.run_id: records[r.run_id] for r in kept}, notes, unfinished)


def ended(run: JobRun) -> str:
    """How a run that did not finish ended, as its tags say (``run_outcomes``): 'budget: the budget ...'."""
    outcome = run.tags.get(OUTCOME_TAG, "")
    return description(outcome, run.tags.get(REASON_TAG, "")) if outcome else ""
