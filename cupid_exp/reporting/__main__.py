"""``python -m cupid_exp.reporting``: the report (same as ``python -m cupid_exp.report``)."""

from cupid_exp.errors import pipe_safe
from cupid_exp.reporting.cli import main

raise SystemExit(pipe_safe(main))
