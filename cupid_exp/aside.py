"""A file a rerun reads back that cannot be read at all (a corrupt cache, a journal of garbage) is set aside, not
deleted and not fatal: renamed ``<name>.corrupt-<UTC time>`` beside itself, with one warning line naming both and
what the job does without it. The job then goes on as if the file had never been there (or from what else it
knows), so a rerun runs whatever the disk holds, and the bytes stay for whoever wants to look at them.
It imports nothing of cupid_exp: the model layer, the journal and the stores all stand on it.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

log = logging.getLogger(__name__)


def aside_name(path: Path) -> Path:
    """Where ``path`` goes: beside it, stamped to the second (a second one within the second gets a counter)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    return target


def set_aside(path: Path, what: str, why: BaseException | str, then: str, *, companions: tuple[str, ...] = (),
              copy: bool = False) -> Path:
    """Rename ``path`` aside (and its ``companions``: suffixes of files that belong to it, e.g. SQLite's ``-wal``)
    and say so in one warning: ``what`` it is, ``why`` it is unreadable, and what the job does ``then``. ``copy``:
    copy its bytes aside instead, for a file other processes hold open and the caller rewrites in place."""
    target = aside_name(path)
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
    """Whether an unterminated last line of a JSON-lines file looks like a write cut short (the start of a JSON
    object, text) rather than garbage: the first is cut off as before, the second makes the file unreadable."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return raw.lstrip().startswith(b"{") and not raw.endswith(b"\n")
