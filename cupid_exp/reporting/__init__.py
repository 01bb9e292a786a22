"""Reporting: leaderboards, comparisons, plots and config diffs, read back from the MLflow store.

``runs`` (JobRun, MLflow queries, the records cache) → ``selection`` (which runs count) → ``tidy``
(the one frame of numbers, from ``cupid_exp.scoring``) → ``leaderboard`` / ``settings_table`` /
``compare`` (pivots of it) → ``render`` (pandas' Markdown, HTML, CSV); ``plots`` draws per-instance
records; ``diff`` turns two runs' configs into Hydra overrides. ``cli`` is ``python -m cupid_exp.report``.
"""

from cupid_exp.reporting.diff import ConfigDiff, diff_runs, overrides_to_reach
from cupid_exp.reporting.diff_compose import compose, format_value, leaf_diffs
from cupid_exp.reporting.diff_specs import RunSpec, load_spec, spec_from_job_dir, spec_from_mlflow
from cupid_exp.reporting.plots import (plot_by_history_length, plot_by_relevant_position, plot_by_type,
                                       save_report_plots, save_run_plots)
from cupid_exp.reporting.runs import (JobRun, get_job_run, load_records, search_job_runs, setting_label,
                                      tracking_uri)

__all__ = ["ConfigDiff", "JobRun", "RunSpec", "compose", "diff_runs", "format_value", "get_job_run", "leaf_diffs",
           "load_records", "load_spec", "overrides_to_reach",
           "plot_by_history_length", "plot_by_relevant_position", "plot_by_type", "save_report_plots",
           "save_run_plots", "search_job_runs", "setting_label", "spec_from_job_dir",
           "spec_from_mlflow", "tracking_uri"]
