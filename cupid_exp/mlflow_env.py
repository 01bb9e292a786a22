"""MLflow's process-wide tracking URI, kept from leaking out of our own calls.

Shared by the code that publishes runs (``tracking``) and the code that reads them (``reporting``): a leaf, so
that the reader need not import the publisher (which builds the sweep's leaderboard with the reader).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def env_uri_kept() -> Iterator[None]:
    """``mlflow.set_tracking_uri`` also exports ``MLFLOW_TRACKING_URI``, which the job config reads: keep our own
    calls of it from leaking into the next job of a sweep (``paths.output_root=a,b``) or into child processes."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
