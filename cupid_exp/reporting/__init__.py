"""Reporting: leaderboards, comparisons, plots and config diffs, read back from the MLflow store.

``runs`` (JobRun, MLflow queries, the records cache) → ``selection`` (which runs count) → ``tidy``
(the one frame of numbers, from ``cupid_exp.scoring``) → ``leaderboard`` / ``settings_table`` /
``compare`` (pivots of it) → ``render`` (pandas' Markdown, HTML, CSV); ``plots`` draws per-instance
records; ``diff`` turns two runs' configs into Hydra overrides. ``cli`` is ``python -m cupid_exp.report``.
"""
