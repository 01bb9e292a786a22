"""Where a run's code came from (git commit, uncommitted changes): MLflow sets no git tags under ``python -m``."""

from __future__ import annotations

import functools
import subprocess

from cupid_exp import __version__
from cupid_exp.resources import source_root


@functools.lru_cache(maxsize=1)
def git_state() -> dict[str, str]:
    """{'git_commit', 'git_dirty'} of the checkout this package runs from ('unknown' for an installed wheel)."""
    root = source_root()
    if root is None:
        return {"git_commit": "unknown", "git_dirty": "unknown", "cupid_exp_version": __version__}

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": "unknown", "git_dirty": "unknown", "cupid_exp_version": __version__}
    return {"git_commit": commit or "unknown", "git_dirty": str(dirty).lower(), "cupid_exp_version": __version__}
