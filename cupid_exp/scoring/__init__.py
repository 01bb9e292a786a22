"""Scoring: statistics and failure policy (``statistics``), a job's numbers (``summary``), bootstrap intervals and
paired comparisons (``bootstrap``). ``statistics`` needs no pandas or numpy."""
