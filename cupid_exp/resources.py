"""Where the shipped ``conf/`` and ``prompts/`` live: beside the package in a checkout, inside it in a wheel."""

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
