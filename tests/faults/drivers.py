"""How a cell drives its fault when the stub alone cannot: each driver runs the faulted command, checks the fault
happened (the process killed and gone, the server dead, the disk full), and removes the fault for the resume
(``repair``). ``stub``: the stub's config is the fault; the others are context managers around the cell.

A command runs in this process (``in_process``) unless its process is the point: a kill, a signal, or a fault
injected while it runs (the tracking server's death, the disk filling up), which needs it running beside the test."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from functools import partial
from pathlib import Path
from typing import Any, Callable

from helpers.cli_runner import PROJECT_ROOT, run_job
from helpers.mlflow_server import free_port, kill, serve
from helpers.processes import alive, children
from helpers.tmpfs import mount_tmpfs, unmount

from faults.modes import Cell, env


def in_process(cmd: list[str]) -> subprocess.CompletedProcess:
    """``cmd`` run by the CLI's entry in this process (``run_job``): its exit code and everything printed, its worker
    processes' too, with a fresh MLflow run worker (one left from an earlier run prints into that run's output). An
    untracked sweep's loky workers are kept for the next command's (``helpers.sweep_workers``: starting two costs more
    than the rest of a sweep cell), each command starting on them as on new ones; a tracked job's would keep MLflow's
    state of its store, which a new process would not."""
    return run_job(cmd, env=env(), check=False, park=False, keep_sweep_workers="tracking=none" in cmd)


class FaultMissed(AssertionError):
    """A timed fault landed outside its window (a kill after the store was whole): the fault did not happen, so the
    cell proves nothing; the test runs it again from nothing, with the kill at the window's start."""


class StubDriver:
    """The fault is the stub's (or the command's): run the command, and that is all."""

    tracking, seed_store, both = False, True, ()

    def __init__(self, cell: Cell, stub: Any):
        self.cell, self.stub = cell, stub

    def __enter__(self) -> "StubDriver":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        return in_process(cmd)

    def repair(self) -> None:
        pass


def _wait(what: Callable[[], Any], timeout: float, message: str, poll: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := what():
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {message}")


def _requests_seen(stub: Any) -> int:
    """Requests the stub has had: live ones, and the Batch API's uploads."""
    return stub.stats()["total_received"] + stub.batches.uploads + stub.batches.upload_refusals


def _first_request(stub: Any, proc: subprocess.Popen) -> bool:
    """The stub has a request (a live one, or a Batch API upload), or the run is over."""
    return _requests_seen(stub) > 0 or proc.poll() is not None


def _inside_model_phase(stub: Any, proc: subprocess.Popen, seed: str) -> None:
    """Wait for a seeded instant inside the model phase: after the stub's ``k``-th request (seeded, 1 to 4; the
    first or second upload for the Batch API, whose jobs send few), then a seeded fraction of the stub's latency, so
    that a request is in flight (processed and billed after the signal) whatever the machine's speed. A fixed delay
    after the first request outlived a fast mode's whole run on an idle machine."""
    rnd = random.Random(seed)
    k = rnd.randint(1, 2 if "batch" in seed else 4)
    _wait(lambda: _requests_seen(stub) >= k or proc.poll() is not None, 120, f"request {k}")
    time.sleep(rnd.uniform(0.0, 0.25))


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


ORPHANS_GONE_S = 10  #: every process a job killed by SIGKILL started is gone this soon after it, having said nothing


def _killed(proc: subprocess.Popen, out: Path, err: Path, group: bool = False) -> subprocess.CompletedProcess:
    """SIGKILL ``proc`` (still running: the instant was inside the run), or its whole process group (``group``: a
    terminal's kill); it and every process it started are gone within ``ORPHANS_GONE_S``, none printing a traceback
    (they share its stderr)."""
    assert proc.poll() is None, f"the run ended before its kill: {err.read_text()[-2000:]}"
    started = _descendants(proc.pid)
    if group:
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    try:
        _wait(lambda: not [p for p in started if alive(p)], ORPHANS_GONE_S, "the killed job's processes to end",
              poll=0.1)
    except AssertionError as exc:
        for pid in started:  # leave nothing running; the cell fails all the same
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        left = [p for p in started if alive(p)]
        raise AssertionError(f"processes the killed job started outlived it: {left}") from exc
    assert "Traceback" not in err.read_text(), err.read_text()[-3000:]
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text())


class _Started(StubDriver):
    group = False  # in a process group of its own (killed whole)

    def _start(self, cmd: list[str]) -> tuple[subprocess.Popen, Path, Path]:
        out, err = self.cell.tmp / "killed.out", self.cell.tmp / "killed.err"
        with out.open("w") as o, err.open("w") as e:
            proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env(), stdout=o, stderr=e, start_new_session=self.group)
        return proc, out, err


class KillDriver(_Started):
    """kill -9 at a seeded instant of the model phase (``_inside_model_phase``: the stub answers in 300 ms, so requests
    are in flight, processed and billed after the kill)."""

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        proc, out, err = self._start(cmd)
        try:
            _inside_model_phase(self.stub, proc, f"kill-{self.cell.mode}")
            return _killed(proc, out, err)
        finally:
            if proc.poll() is None:
                proc.kill()


def _run_statuses(db: Path) -> dict[str, list[str]]:
    """The statuses of the runs in the SQLite store ``db``, by their ``cupid.kind`` (job, sweep)."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        rows = con.execute("SELECT t.value, r.status FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                           "AND t.key = 'cupid.kind'").fetchall()
    statuses: dict[str, list[str]] = {}
    for kind, status in rows:
        statuses.setdefault(kind, []).append(status)
    return statuses


class SigtermDriver(_Started):
    """SIGTERM (a scheduler's preemption, ``kill``) to the command's process alone at a seeded instant of the model
    phase, as ``KillDriver`` kills: the job must stop by itself, say so and stop the processes it started. A joblib
    sweep tracks too: each job that started ends its MLflow run KILLED and says so, the sweep's parent run ends KILLED
    (a single job's run is checked by tests/durability/test_signals.py: tracking costs a cell here ~25 s)."""

    signum, said = signal.SIGTERM, "interrupted (SIGTERM) in sweep"

    def __init__(self, cell: Cell, stub: Any):
        super().__init__(cell, stub)
        self.tracking = cell.mode == "sweep"

    def _send(self, proc: subprocess.Popen) -> None:
        proc.send_signal(self.signum)

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        proc, out, err = self._start(cmd)
        try:
            _inside_model_phase(self.stub, proc, f"{signal.Signals(self.signum).name}-{self.cell.mode}")
            assert proc.poll() is None, f"the run ended before its signal: {err.read_text()[-2000:]}"
            started = _descendants(proc.pid)
            self._send(proc)
            proc.wait(timeout=60)
            _wait(lambda: not [p for p in started if alive(p)], ORPHANS_GONE_S, "the stopped job's processes to end",
                  poll=0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
        if self.tracking:
            statuses = _run_statuses(self.cell.root / "mlflow.db")
            assert statuses.get("job") and set(statuses["job"]) == {"KILLED"}, (statuses, err.read_text()[-2000:])
            assert statuses.get("sweep") == ["KILLED"], statuses
            said = [line for line in err.read_text().splitlines() if line.startswith(self.said)]
            assert len(said) >= len(statuses["job"]), err.read_text()[-2000:]  # one line a job
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text())


class CtrlCDriver(SigtermDriver):
    """Ctrl-C as a terminal sends it: SIGINT to every process of the command's group (the job, its workers, a joblib
    sweep's workers, their helpers), at a seeded instant of the model phase; the same checks as SIGTERM's."""

    signum, said, group = signal.SIGINT, "interrupted in sweep", True

    def _start(self, cmd: list[str]) -> tuple[subprocess.Popen, Path, Path]:
        # SIGINT at its default whatever this test process inherited (a shell's background job ignores it)
        reset = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                 "os.execv(sys.argv[1], sys.argv[1:])")
        return super()._start([sys.executable, "-c", reset, *cmd])

    def _send(self, proc: subprocess.Popen) -> None:
        os.killpg(proc.pid, signal.SIGINT)


def _schema_version(db: Path) -> str | None:
    """The MLflow schema version a SQLite store is migrated to (None: no version yet, or not a store)."""
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            rows = con.execute("SELECT version_num FROM alembic_version").fetchall()
    except sqlite3.Error:
        return None
    return rows[0][0] if rows else None


def _made_store(folder: Path) -> tuple[str | None, float]:
    """A store made as MLflow makes one, in ``folder``: its schema version, and the seconds its making took."""
    from mlflow.tracking import MlflowClient

    folder.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    MlflowClient(f"sqlite:///{folder / 'mlflow.db'}").search_experiments(max_results=1)
    return _schema_version(folder / "mlflow.db"), time.monotonic() - start


_WHOLE: list[str | None] = []  #: the schema version a store MLflow made has here (``StoreDriver``)


class StoreDriver(_Started):
    """kill -9 while the first command makes its MLflow store (its schema migrations take about a second): at a seeded
    instant after the store's file (or one made aside) appears, within the first 30% of the time this machine takes to
    make a store now (measured here: a fixed delay outlived the whole creation on an idle machine). The fault happened
    if the store was not whole at the kill (a file made aside, or a schema short of the version a made store has);
    if not (this process slowed while it measured, the job's store made faster), ``FaultMissed``: a retry kills at once
    when the store's file appears."""

    tracking, seed_store, group = True, False, True  # the store may be made by the job's MLflow worker

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        # the version a whole store has (once a process), and how long making one takes, warm: the first in this
        # process also imports MLflow's migration modules, which made the kill come after the job's store was made
        if not _WHOLE:
            _WHOLE.append(_made_store(self.cell.tmp / "whole")[0])
        whole, (_, making_s) = _WHOLE[0], _made_store(self.cell.tmp / "whole-again")
        db = self.cell.root / "mlflow.db"
        proc, out, err = self._start(cmd)
        try:
            _wait(lambda: db.exists() or list(self.cell.root.glob(".mlflow.db.*")) or proc.poll() is not None, 120,
                  "the store")
            share = random.Random(f"store-{self.cell.mode}").uniform(0.0, 0.3) if not self.cell.attempt else 0.0
            time.sleep(share * making_s)
            aside = list(self.cell.root.glob(".mlflow.db.*"))
            if proc.poll() is not None:
                raise FaultMissed(f"the run ended before its kill (attempt {self.cell.attempt})")
            killed = _killed(proc, out, err, group=True)
        finally:
            if proc.poll() is None:
                proc.kill()
        if not (aside or _schema_version(db) != whole):
            raise FaultMissed(f"the kill came after the store was made (attempt {self.cell.attempt})")
        return killed


class TrackingDriver(_Started):
    """A real ``mlflow server`` (``helpers.mlflow_server``) that dies for good (SIGKILL, its process group) once the
    job has had two replies; the job must end within ``BOUND_S`` (its flush bound, and the rest of its work) with
    exit 5. The resume has the server back (same port, same store)."""

    tracking, FLUSH_S = True, 10  # tracking.flush_timeout_s: the job's bound on the store, once its work is done
    BOUND_S = FLUSH_S + 50

    def __enter__(self) -> "TrackingDriver":
        self.port, self.server = free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"
        self.both = (f"tracking.uri={self.url}", f"tracking.flush_timeout_s={self.FLUSH_S}")
        self._serve()
        return self

    def _serve(self) -> None:
        self.server = serve(self.cell.tmp / "server", self.port, env())

    def _stop(self) -> None:
        if self.server is not None and self.server.poll() is None:
            kill(self.server)

    def __exit__(self, *exc: Any) -> None:
        self._stop()

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        proc, out, err = self._start(cmd)
        try:
            _wait(lambda: self.stub.stats()["total_completed"] >= 2 or proc.poll() is not None, 120, "two replies")
            self._stop()
            assert self.server.returncode is not None
            proc.wait(timeout=self.BOUND_S)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"the job was still running {self.BOUND_S} s after its tracking server died") from exc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text())

    def repair(self) -> None:
        self._serve()


class DiskDriver(_Started):
    """The output root on a 4 MB tmpfs (needs the right to mount: root in this project's sandbox; skipped elsewhere)
    that fills up while the job runs: the moment the stub sees its first request, a file takes all the space left.
    The resume has it freed."""

    BOUND_S = 60  # a job ends within seconds of its disk filling up

    def __enter__(self) -> "DiskDriver":
        mount_tmpfs(self.cell.root, "4m")
        self.filler = self.cell.root / "filler"
        return self

    def __exit__(self, *exc: Any) -> None:
        unmount(self.cell.root)

    def fill(self, leave: int = 0) -> None:
        """Take all the space but ``leave`` bytes."""
        stat = os.statvfs(self.cell.root)
        try:  # the job's own writes may have filled it already: then the filler cannot even be created
            with self.filler.open("ab") as out:
                out.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - leave))
                out.flush()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        stat = os.statvfs(self.cell.root)
        assert stat.f_bavail * stat.f_frsize <= leave + stat.f_frsize

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        proc, out, err = self._start(cmd)
        try:
            _wait(lambda: _first_request(self.stub, proc), 120, "a first request")
            self.fill()
            proc.wait(timeout=self.BOUND_S)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"the job was still running {self.BOUND_S} s after the disk filled up") from exc
        finally:
            if proc.poll() is None:
                proc.kill()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text())

    def repair(self) -> None:
        self.filler.unlink()
        subprocess.run(["mount", "-o", "remount,size=64m", str(self.cell.root)], check=True)


class FullDiskDriver(DiskDriver):
    """The disk is full before the job starts (64 KB left: its folder and Hydra's files fit, little more)."""

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        self.fill(leave=64 * 1024)
        return in_process(cmd)


# -- issue 40 item 3: whatever the cache or state holds, a rerun runs
GARBAGE = b"\x00\x17garbage where state was\xff\n" * 24  #: neither JSON, nor text, nor a SQLite database


def _unreadable(path: Path) -> bool:
    """Whether ``path`` is what its reader cannot read: not a SQLite database (``.db``), else not JSON lines."""
    if path.suffix == ".db":
        try:
            with closing(sqlite3.connect(path)) as con:
                con.execute("SELECT 1 FROM sqlite_master").fetchall()
        except sqlite3.DatabaseError as exc:
            return "not a database" in str(exc)
        return False
    try:
        [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    except ValueError:
        return True
    return False


#: each state file the matrix corrupts: where it is under the output root, and whether the job's first run must make
#: it (else it is planted before any run: a cache or a list of batches is shared, a new job may meet a broken one)
STATE_FILES = {
    "cache": ("cache/responses/cache.db", False),
    "batch_ledger": ("cache/batches/batches.jsonl", False),
    "journal": ("journal/*.jsonl", True),
    "usage_ledger": ("journal/usage/*.jsonl", True),
    "budget_ledger": ("journal/*.budget.json", True),
    "lock": ("journal/*.lock", True),
    "mlflow_store": ("mlflow.db", True),
    "persona_files": ("synthesis/*/state.json", True),
}


class CorruptDriver(StubDriver):
    """A state file the job reads back is garbage when it starts: planted before the only run, or written over once a
    first run (exit 0) made it. The fault happened when every such file is unreadable to its reader (checked before
    the run); the catalogue's check then finds the warning naming it and its bytes kept aside."""

    def __init__(self, cell: Cell, stub: Any, kind: str):
        super().__init__(cell, stub)
        self.kind = kind
        self.tracking = kind == "mlflow_store"
        self.corrupted: list[Path] = []

    def _files(self) -> list[Path]:
        pattern, _ = STATE_FILES[self.kind]
        found = [p for p in self.cell.root.glob(pattern) if p.is_file()]
        if self.kind == "persona_files":  # the run's state and its persona's file
            found += [p for p in self.cell.root.glob("synthesis/*/journeys/*.json") if p.is_file()]
        return found

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        pattern, made_by_a_run = STATE_FILES[self.kind]
        if made_by_a_run:
            first = in_process(cmd)
            assert first.returncode == 0, first.stderr[-2000:]
            files = self._files()
            if self.kind == "mlflow_store":
                for extra in self.cell.root.glob("mlflow.db-*"):
                    extra.unlink()
        else:
            files = [self.cell.root / pattern]
            files[0].parent.mkdir(parents=True, exist_ok=True)
        assert files, f"no {pattern} under {self.cell.root}"
        for path in files:
            path.write_bytes(GARBAGE)
            if self.kind != "lock":  # the lock's bytes are nobody's: only its holder note is read
                assert _unreadable(path), path
        if self.kind == "lock":
            for path in files:
                note = path.with_name(path.name + ".holder.json")
                note.write_bytes(GARBAGE)
                assert _unreadable(note)
        self.corrupted = files
        (self.cell.tmp / "corrupted.json").write_text(json.dumps([str(p) for p in files]))
        return in_process(cmd)


DRIVERS = {"stub": StubDriver, "kill": KillDriver, "store": StoreDriver, "tracking": TrackingDriver,
           "disk_fills": DiskDriver, "disk_full": FullDiskDriver, "sigterm": SigtermDriver,
           "ctrl_c": CtrlCDriver,
           **{f"corrupt_{kind}": partial(CorruptDriver, kind=kind) for kind in STATE_FILES}}
