"""Scoring: statistics and failure policy (``statistics``), metrics (``metrics``, ``summary``), bootstrap intervals and
paired comparisons (``bootstrap``). ``statistics`` needs no pandas or numpy."""
