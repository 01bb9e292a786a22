"""The real CLI with one injected bug: the preference parser raises TypeError on its Nth call
(``CUPID_TEST_BUG_AT``), as a code error would. Usage: python tests/helpers/buggy_cli.py <overrides>."""

from __future__ import annotations

import os
import sys

import cupid_exp.tasks.inference as inference

_real = inference.parse_preference
_calls = {"n": 0}


def _buggy(text: str) -> str:
    _calls["n"] += 1
    if _calls["n"] == int(os.environ.get("CUPID_TEST_BUG_AT", "1")):
        raise TypeError("injected bug in the preference parser")
    return _real(text)


inference.parse_preference = _buggy

if __name__ == "__main__":
    from cupid_exp.cli import main

    sys.argv = ["cupid_exp", *sys.argv[1:]]
    main()
