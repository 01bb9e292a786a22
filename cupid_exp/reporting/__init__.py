"""Reporting: leaderboards, comparisons, plots and config diffs, read back from the MLflow store.

``runs`` (JobRun, MLflow queries, the records cache) → ``selection`` (which runs count) → ``tidy``
(the one frame of numbers, from ``cupid_exp.scoring``) → ``leaderboard`` / ``settings_table`` /
``compare`` (pivots of it) → ``render`` (pandas' Markdown, HTML, CSV); ``plots`` draws per-instance
records; ``diff`` turns two runs' configs into Hydra overrides. ``cli`` is ``python -m cupid_exp.report``.
"""

from cupid_exp.reporting.build import build_report
from cupid_exp.reporting.compare import compare_runs
from cupid_exp.reporting.diff import ConfigDiff, diff_runs, overrides_to_reach
from cupid_exp.reporting.diff_compose import compose, format_value, leaf_diffs
from cupid_exp.reporting.diff_specs import RunSpec, load_spec, spec_from_job_dir, spec_from_mlflow
from cupid_exp.reporting.leaderboard import leaderboard
from cupid_exp.reporting.plots import (
    plot_by_history_length,
    plot_by_relevant_position,
    plot_by_type,
    save_report_plots,
    save_run_plots,
)
from cupid_exp.reporting.reference import load_reference
from cupid_exp.reporting.render import render
from cupid_exp.reporting.runs import JobRun, get_job_run, load_records, search_job_runs, setting_label, tracking_uri
from cupid_exp.reporting.selection import Selection, select_runs
from cupid_exp.reporting.settings_table import setting_table
from cupid_exp.reporting.tables import Table, extra_settings
from cupid_exp.reporting.tidy import tidy_frame

__all__ = ["ConfigDiff", "JobRun", "RunSpec", "Selection", "Table", "build_report", "compare_runs", "compose",
           "diff_runs", "extra_settings", "format_value", "get_job_run", "leaderboard", "leaf_diffs", "load_records",
           "load_reference", "load_spec", "overrides_to_reach", "plot_by_history_length", "plot_by_relevant_position",
           "plot_by_type", "render", "save_report_plots", "save_run_plots", "search_job_runs", "select_runs",
           "setting_label", "setting_table", "spec_from_job_dir", "spec_from_mlflow", "tidy_frame", "tracking_uri"]
