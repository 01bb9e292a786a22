"""Scoring: the statistics and the failure policy (defined once: ``statistics``), a job's metrics (``metrics``,
``summary``), bootstrap intervals and paired comparisons (``bootstrap``).

A task scoring one instance imports ``statistics`` alone, without pandas and numpy (the summary loads them, later:
``cupid_exp.job``).
"""
