"""The entry's quick exit: what the interpreter's shutdown must do still happens (threads, atexit, streams),
and the exit code is the job's."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.tmpfs import mount_tmpfs, unmount

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


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 256 KB tmpfs (needs the right to mount: root in this project's sandbox; skipped elsewhere)."""
    disk = tmp_path / "disk"
    mount_tmpfs(disk, "256k")
    try:
        yield disk
    finally:
        unmount(disk)


def _fill(disk: Path) -> None:
    try:
        with (disk / "filler").open("ab", buffering=0) as out:
            while True:
                out.write(bytes(4096))
    except OSError:
        pass  # full


def test_a_sweep_jobs_status_is_written_on_the_disk_that_filled_up_during_the_job(tiny_disk: Path) -> None:
    """The room a sweep's job takes at its start is what its status needs once the disk is full; without it the
    write fails (the sweep's end would not know how the job ended: an OSError through Hydra's sweeper)."""
    from cupid_exp.entry import _keep_room, _write_status
    from cupid_exp.outputs import EnvironmentFailure

    job = tiny_disk / "0_job"
    room = _keep_room(job)
    assert room is not None and room.exists()
    _fill(tiny_disk)
    status = '{"job": "0_job", "outcome": "environment", "reason": "environment failure: ..."}' + " " * 2000
    with pytest.raises(EnvironmentFailure, match=r"other/job_status\.json: No space left on device \[ENOSPC\]"):
        _write_status(tiny_disk / "other" / "job_status.json", status, None)
    _write_status(job / "job_status.json", status, room)
    assert (job / "job_status.json").read_text() == status and not room.exists()


def test_loky_resource_trackers_cleanup_warnings_stay_off_the_console(monkeypatch) -> None:
    """A sweep's workers are stopped by force at its end; loky's resource tracker (a process of ours, on our stderr)
    then warned "There appear to be 1 leaked semlock objects" after the sweep's last line (seen in CI). The entry
    hands its children a filter for that module's warnings, after any the user gave."""
    from cupid_exp import entry

    monkeypatch.setenv("PYTHONWARNINGS", "error::DeprecationWarning")
    entry._quiet_in_children("ignore::UserWarning:joblib.externals.loky.backend.resource_tracker")
    entry._quiet_in_children("ignore::UserWarning:joblib.externals.loky.backend.resource_tracker")
    import os

    assert os.environ["PYTHONWARNINGS"] == ("error::DeprecationWarning,"
                                           "ignore::UserWarning:joblib.externals.loky.backend.resource_tracker")
    warn_there = ("from joblib.externals.loky.backend import resource_tracker as r\n"
                  "exec(compile('import warnings; warnings.warn(\"resource_tracker: 1 leaked semlock\")', r.__file__,"
                  " 'exec'), r.__dict__)\n"
                  "import warnings; warnings.warn('elsewhere')\n")
    proc = subprocess.run([sys.executable, "-c", warn_there], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "leaked semlock" not in proc.stderr and "elsewhere" in proc.stderr, proc.stderr


def test_a_connection_error_outside_tracking_is_not_called_the_stores() -> None:
    """A ConnectionError from elsewhere in the job (a tokenizer's download) goes on as itself; one raised from MLflow
    or our tracking modules is the store's failure, in one line."""
    from omegaconf import OmegaConf

    from cupid_exp.entry import _store_failure

    cfg = OmegaConf.create({"tracking": {"uri": "http://127.0.0.1:1"}})

    def raised_in(filename: str) -> ConnectionError:
        try:
            exec(compile("raise ConnectionError('no route to host')", filename, "exec"))
        except ConnectionError as exc:
            return exc
        raise AssertionError("nothing raised")

    assert _store_failure(raised_in("/site-packages/tiktoken/load.py"), cfg) is None
    failure = _store_failure(raised_in("/site-packages/mlflow/store/tracking/rest_store.py"), cfg)
    assert failure is not None and "the MLflow store at http://127.0.0.1:1" in str(failure)
