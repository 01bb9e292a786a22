"""MLflow's process-wide tracking URI, kept from leaking out of our calls; a leaf shared by ``tracking`` and
``reporting``."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def env_uri_kept() -> Iterator[None]:
    """``mlflow.set_tracking_uri`` exports ``MLFLOW_TRACKING_URI``, which the config reads: keep it from leaking into a
    sweep's next job or child processes."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
