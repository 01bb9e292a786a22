"""Reporting from the MLflow store: ``runs`` → ``selection`` → ``tidy`` (one frame of numbers) → ``leaderboard`` /
``settings_table`` / ``compare`` → ``render``; ``plots``, ``diff``, and ``cli`` (``python -m cupid_exp.report``)."""
