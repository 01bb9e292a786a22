"""``python -m cupid_exp.report``: paper-layout leaderboards from the MLflow store (``cupid_exp.reporting``)."""

from cupid_exp.reporting.cli import main

if __name__ == "__main__":
    from cupid_exp.errors import pipe_safe

    raise SystemExit(pipe_safe(main))
