"""A file a rerun cannot read at all is renamed ``<name>.corrupt-<UTC time>`` with one warning, neither deleted nor
fatal: the job goes on without it. Imports nothing of cupid_exp, so every layer can use it."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

log = logging.getLogger(__name__)


def set_aside(path: Path, what: str, why: BaseException | str, then: str, *, companions: tuple[str, ...] = (),
              copy: bool = False) -> Path:
    """Rename ``path`` (and its ``companions``, e.g. SQLite's ``-wal``) aside with one warning naming ``what``, ``why``
    and what the job does ``then``. ``copy``: copy instead, for a file others hold open."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())  # beside it, to the second (then a counter)
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    if copy:
        shutil.copyfile(path, target)
    else:
        os.replace(path, target)
    for suffix in companions:
        extra = path.with_name(path.name + suffix)
        if extra.exists():
            os.replace(extra, target.with_name(target.name + suffix))
    reason = why if isinstance(why, str) else f"{type(why).__name__}: {(str(why).splitlines() or [''])[0][:200]}"
    log.warning("%s %s is unreadable (%s): set aside as %s; %s", what, path, reason, target.name, then)
    return target


def torn(raw: bytes) -> bool:
    """Whether an unterminated last line looks like a cut-short write (cut off) rather than garbage (unreadable)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return raw.lstrip().startswith(b"{") and not raw.endswith(b"\n")
