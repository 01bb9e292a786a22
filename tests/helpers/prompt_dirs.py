"""Prompt folders in the official layout for tests: a drop-in is taken whole (``cupid_exp.prompts``), so a test
that replaces a few files starts from a complete folder."""

from __future__ import annotations

import shutil
from pathlib import Path

from cupid_exp.prompts import MATCHER_EXAMPLES, PROJECT_PROMPTS


def full_prompt_folder(target: Path) -> Path:
    """``target`` holding every project prompt file but the matcher's few-shot examples (the official tool keeps
    those in Python, beside its prompts/: ``cupid_exp.prompts``)."""
    examples = PROJECT_PROMPTS / MATCHER_EXAMPLES
    shutil.copytree(PROJECT_PROMPTS, target, dirs_exist_ok=True,
                    ignore=lambda folder, names: [n for n in names if Path(folder, n) == examples])
    return target
