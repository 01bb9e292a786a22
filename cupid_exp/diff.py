"""``python -m cupid_exp.diff A B``: two runs' config difference as Hydra overrides (``cupid_exp.reporting.diff``)."""

from cupid_exp.reporting.diff import main

if __name__ == "__main__":
    from cupid_exp.errors import pipe_safe

    raise SystemExit(pipe_safe(main))
