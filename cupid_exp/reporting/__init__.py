"""Reporting from the MLflow store: ``runs`` → ``selection`` → ``build`` (one frame of numbers, the tables pivoted
from it, a paired comparison) → ``render``; ``plots``, ``diff``, and ``cli`` (``python -m cupid_exp.report``)."""
