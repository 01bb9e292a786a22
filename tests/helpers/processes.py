"""The process table, read from /proc: a job's child processes, and whether a process still runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def alive(pid: int) -> bool:
    """Running or sleeping: neither gone nor a zombie."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# Ctrl-C at its default in a started CLI, as a terminal starts it, even when the suite runs in the background: a
# non-interactive shell's `cmd &` ignores SIGINT for cmd and everything it starts (Python then keeps it ignored)
_DEFAULT_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                   "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def with_default_sigint(cmd: list[str]) -> list[str]:
    """``cmd`` (a ``sys.executable`` command) started with SIGINT at its default, so that Ctrl-C reaches it."""
    return [cmd[0], "-c", _DEFAULT_SIGINT, *cmd[1:]]


def say_and_leave(text: str) -> None:
    """In a child process: ``text`` on stdout and on stderr, then gone without flushing, as a job's worker leaves."""
    import os
    import sys

    print(text)
    print(text, file=sys.stderr)
    os._exit(0)


def say_when_told(told: Any, text: str) -> None:
    """In a child process: wait for the event ``told`` (a minute at most), then ``say_and_leave``."""
    told.wait(60)
    say_and_leave(text)
