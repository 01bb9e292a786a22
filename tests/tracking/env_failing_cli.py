"""The real CLI on a disk that fails: the journal's Nth append (``CUPID_TEST_FAIL_AT``) writes half its line, then
fails with ``CUPID_TEST_ERRNO`` (an errno name, e.g. ENOSPC), as a full disk does. Usage:
python tests/tracking/env_failing_cli.py <overrides>."""

from __future__ import annotations

import errno
import os
import sys
from types import SimpleNamespace

import cupid_exp.durability.journal as journal

_AT = int(os.environ.get("CUPID_TEST_FAIL_AT", "1"))
_ERRNO = getattr(errno, os.environ.get("CUPID_TEST_ERRNO", "ENOSPC"))
_writes = {"n": 0}


def _write(fd: int, data: bytes) -> int:
    _writes["n"] += 1
    if _writes["n"] >= _AT:
        os.write(fd, bytes(data[: len(data) // 2]))
        raise OSError(_ERRNO, os.strerror(_ERRNO))
    return os.write(fd, data)


journal.os = SimpleNamespace(**{**{name: getattr(os, name) for name in dir(os) if not name.startswith("__")},
                                "write": _write})

if __name__ == "__main__":
    from cupid_exp.cli import main

    sys.argv = ["cupid_exp", *sys.argv[1:]]
    main()
