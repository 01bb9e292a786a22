"""The entry's quick exit: what the interpreter's shutdown must do still happens (threads, atexit, streams),
and the exit code is the job's."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cupid_exp.entry import exit_code_of


def test_exit_now_joins_threads_runs_atexit_and_flushes(tmp_path: Path) -> None:
    marker = tmp_path / "atexit.txt"
    late = tmp_path / "thread.txt"
    script = textwrap.dedent(f"""
        import atexit, sys, threading, time
        from pathlib import Path
        from cupid_exp.entry import exit_now

        atexit.register(lambda: Path({str(marker)!r}).write_text("ran"))
        threading.Thread(target=lambda: (time.sleep(0.5), Path({str(late)!r}).write_text("done"))).start()
        sys.stdout.write("buffered, no newline")
        exit_now(3)
        print("never")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "buffered, no newline"
    assert marker.read_text() == "ran" and late.read_text() == "done"


@pytest.mark.parametrize(("code", "expected"), [(None, 0), (0, 0), (3, 3), ("a message", 1)])
def test_exit_codes_from_sys_exit(code, expected, capsys) -> None:
    assert exit_code_of(SystemExit(code)) == expected
    assert capsys.readouterr().err == ("a message\n" if isinstance(code, str) else "")


def test_exit_now_with_a_live_process_pool_does_not_hang() -> None:
    """A joblib/loky or concurrent.futures pool (the joblib launcher's) is stopped by threading's exit hooks; a
    plain join of its manager thread would wait forever."""
    script = textwrap.dedent("""
        from concurrent.futures import ProcessPoolExecutor
        from cupid_exp.entry import exit_now

        pool = ProcessPoolExecutor(2)
        assert pool.submit(abs, -4).result() == 4
        exit_now(0)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
