"""MLflow's process-wide tracking URI, kept from leaking out of our calls (shared by tracking and reporting)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def env_uri_kept() -> Iterator[None]:
    """Keep ``set_tracking_uri``'s export of ``MLFLOW_TRACKING_URI`` from leaking into later jobs or children."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
