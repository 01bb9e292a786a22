"""Where the shipped ``conf/`` and ``prompts/`` live (beside the package in a checkout, inside it in a wheel), and which
commit of the checkout runs."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from cupid_exp import __version__

PACKAGE_DIR = Path(__file__).resolve().parent


def _shipped(name: str) -> Path:
    installed, checkout = PACKAGE_DIR / name, PACKAGE_DIR.parent / name
    for folder in (installed, checkout):
        if folder.is_dir():
            return folder
    raise FileNotFoundError(f"cupid-exp's {name}/ folder is missing: looked in {installed} and {checkout}; "
                            "reinstall the package")


def conf_dir() -> Path:
    """The Hydra config folder (``conf/``)."""
    return _shipped("conf")


def prompts_dir() -> Path:
    """The project's own prompt files (``prompts/``), in the official tool's layout."""
    return _shipped("prompts")


@functools.lru_cache(maxsize=1)
def git_state() -> dict[str, str]:
    """{'git_commit', 'git_dirty'} of the checkout this package runs from ('unknown' for an installed wheel): MLflow
    sets no git tags under ``python -m``."""
    root = PACKAGE_DIR.parent
    if not (root / ".git").exists():
        return {"git_commit": "unknown", "git_dirty": "unknown", "cupid_exp_version": __version__}

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": "unknown", "git_dirty": "unknown", "cupid_exp_version": __version__}
    return {"git_commit": commit or "unknown", "git_dirty": str(dirty).lower(), "cupid_exp_version": __version__}
