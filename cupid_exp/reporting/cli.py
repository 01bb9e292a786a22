"""Paper-layout leaderboards from the MLflow store, with bootstrap intervals and paired comparisons.

``python -m cupid_exp.report`` (docs/reports.md).
"""

from __future__ import annotations

import argparse
import functools
import io
import sys
from pathlib import Path
from typing import Sequence

from cupid_exp.reporting.build import build_report, compare_runs
from cupid_exp.reporting.render import FORMATS, Image, render
from cupid_exp.reporting.runs import (
    DEFAULT_CACHE,
    DEFAULT_TRACKING_URI,
    EPOCHS_NOTE,
    RunIdError,
    get_job_run,
    load_records,
    search_job_runs,
    tracking_uri,
)
from cupid_exp.reporting.selection import select_runs
from cupid_exp.reporting.tables import Table, load_reference
from cupid_exp.scoring.bootstrap import DEFAULT_N_BOOT


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m cupid_exp.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--tracking-uri", default=None,
                   help=f"default: $MLFLOW_TRACKING_URI, else {DEFAULT_TRACKING_URI}")
    p.add_argument("--experiment", default="cupid")
    p.add_argument("--filter", default=None, help="MLflow filter string, e.g. \"params.`data.name` = 'cupid'\"")
    p.add_argument("--format", choices=list(FORMATS), default="markdown")
    p.add_argument("--output", type=Path, default=None, help="write here instead of stdout")
    p.add_argument("--reference", choices=["paper"], default=None, help="add the paper's published rows")
    p.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"), default=None,
                   help="paired comparison of two runs (B − A) on their shared instances; a run id or its first "
                        "digits when unique (the 8 the report prints)")
    p.add_argument("--plots", type=Path, default=None, help="also write cross-model PNG plots into this folder "
                                                            "(--format html puts them inside the page in any case)")
    p.add_argument("--subsets", action="store_true",
                   help="also show runs on a subset (data.limit, data.instance_types) where a run on the whole data "
                        "set exists, each as its own row marked with its subset")
    p.add_argument("--n-boot", type=int, default=DEFAULT_N_BOOT)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where downloaded instances.jsonl are kept")
    args = p.parse_args(argv)
    args.tracking_uri = tracking_uri(args.tracking_uri)
    return args


def _comparison(args: argparse.Namespace, load) -> tuple[list[Table], list[str], list[Image]] | None:
    """The --compare table; None (after saying why) when a run has no records to pair."""
    try:
        a, b = (get_job_run(args.tracking_uri, r) for r in args.compare)
    except RunIdError as exc:
        print(f"--compare: {exc}", file=sys.stderr)
        return None
    notes, recs = [], {}
    for run in (a, b):
        recs[run.run_id] = load(run.run_id)
        if recs[run.run_id] is None:
            print(f"run {run.run_id} has no instances.jsonl artifact: nothing to pair", file=sys.stderr)
            return None
        if run.status != "FINISHED":
            notes.append(f"run {run.short} has status {run.status}: its instances may be incomplete")
    return [compare_runs(a, recs[a.run_id], b, recs[b.run_id], n_boot=args.n_boot, seed=args.seed)], notes, []


def _plots(args: argparse.Namespace, selection) -> tuple[list[Image], list[str]]:
    """The cross-model plots: PNG files in ``--plots``, and inside an HTML page; with a note of where they are."""
    if not args.plots and args.format != "html":
        return [], []
    from cupid_exp.reporting.plots import report_figures

    images, written = [], 0
    if args.plots:
        args.plots.mkdir(parents=True, exist_ok=True)
    for stem, caption, fig in report_figures(selection, seed=args.seed):
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        png = buffer.getvalue()
        if args.plots:
            (args.plots / f"{stem}.png").write_bytes(png)
            written += 1
        if args.format == "html":
            images.append((caption, png))
    notes = [f"plots: {written} PNG files in {args.plots}"] if args.plots else []
    if args.format == "html":
        notes.append(f"plots: {len(images)}, in this page")
    return images, notes


def _leaderboards(args: argparse.Namespace, load) -> tuple[list[Table], list[str], list[Image]] | None:
    """The report's tables, notes and plots; None (after saying why) when there is nothing to report."""
    try:
        runs = search_job_runs(args.tracking_uri, args.experiment, args.filter)
    except LookupError as exc:
        print(str(exc), file=sys.stderr)
        return None
    where = f"in experiment {args.experiment!r} at {args.tracking_uri}" + (
        f" matching --filter {args.filter!r}" if args.filter else "")
    if not runs:
        print(f"no job run {where}: nothing to report, nothing written", file=sys.stderr)
        return None
    selection = select_runs(runs, load, show_subsets=args.subsets)
    if not selection.runs:
        print(f"none of the {len(runs)} job runs {where} is finished and complete ({selection.notes[0]}; "
              f"{len(selection.notes)} skipped): nothing to report, nothing written", file=sys.stderr)
        return None
    notes = list(selection.notes)
    reference = load_reference() if args.reference == "paper" else None
    tables = build_report(selection, reference=reference, n_boot=args.n_boot, seed=args.seed)
    notes.append(f"95% intervals: cluster bootstrap over personas, {args.n_boot} resamples, seed {args.seed}")
    if any(run.epochs > 1 for run in selection.runs):
        notes.append(EPOCHS_NOTE)
    images, where = _plots(args, selection)
    return tables, notes + where, images


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    load = functools.partial(load_records, args.tracking_uri, cache_dir=args.cache_dir)  # run id -> its records
    result = (_comparison if args.compare else _leaderboards)(args, load)
    if result is None:
        return 2
    tables, notes, images = result
    text = render(tables, notes, args.format, images)
    if args.format == "csv" and notes:
        print("\n".join(notes), file=sys.stderr)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
