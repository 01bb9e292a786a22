"""``python -m cupid_exp.reporting``: the report (same as ``python -m cupid_exp.report``)."""

from cupid_exp.reporting.cli import main

raise SystemExit(main())
