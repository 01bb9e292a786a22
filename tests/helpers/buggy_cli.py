"""The real CLI with one injected bug: the preference parser raises TypeError on its Nth call
(``CUPID_TEST_BUG_AT``), as a code error would; with ``CUPID_TEST_BUG_AFTER_JOURNAL`` (a journal folder), on
the first call from the Nth on that comes after an instance is in the journal, so that something finished
before the bug whatever the machine's pace. Usage: python tests/helpers/buggy_cli.py <overrides>."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import cupid_exp.tasks.inference as inference

_real = inference.parse_preference
_calls = {"n": 0}


def _journaled() -> bool:
    folder = os.environ.get("CUPID_TEST_BUG_AFTER_JOURNAL")
    return not folder or any(p.stat().st_size for p in Path(folder).glob("*.jsonl"))


def _buggy(text: str) -> str:
    _calls["n"] += 1
    if _calls["n"] >= int(os.environ.get("CUPID_TEST_BUG_AT", "1")) and not _calls.get("raised") and _journaled():
        _calls["raised"] = 1
        raise TypeError("injected bug in the preference parser")
    return _real(text)


inference.parse_preference = _buggy

if __name__ == "__main__":
    from cupid_exp.cli import main

    sys.argv = ["cupid_exp", *sys.argv[1:]]
    main()
