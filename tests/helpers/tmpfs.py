"""A small tmpfs for tests of a full disk (mounting needs root: this project's sandbox has it; elsewhere the test
is skipped)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


def mount_tmpfs(where: Path, size: str, *options: str) -> None:
    """Mount a tmpfs of ``size`` (e.g. ``256k``, ``4m``) on ``where`` (made if missing), or skip the test;
    ``options``: more mount options (``ro``: a read-only folder, even to root)."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")


def unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True)
