"""Where the shipped config groups and prompt files live, in a checkout and in an installed wheel.

``conf/`` and ``prompts/`` stay top-level in the repository (the layout users edit); the wheel
build maps them into the package as ``cupid_exp/conf`` and ``cupid_exp/prompts``. A source
checkout (or an editable install) finds them beside the package.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def _shipped(name: str) -> Path:
    installed = PACKAGE_DIR / name
    if installed.is_dir():
        return installed
    checkout = PACKAGE_DIR.parent / name
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"cupid-exp's {name}/ folder is missing: looked in {installed} and {checkout}; "
                            "reinstall the package")


def conf_dir() -> Path:
    """The Hydra config folder (``conf/``)."""
    return _shipped("conf")


def prompts_dir() -> Path:
    """The project's own prompt files (``prompts/``), in the official tool's layout."""
    return _shipped("prompts")


def source_root() -> Path | None:
    """The git checkout this package runs from, if any (for provenance tags)."""
    root = PACKAGE_DIR.parent
    return root if (root / ".git").exists() else None
