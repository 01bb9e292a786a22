"""A real ``mlflow server`` over HTTP for the tests whose point is one (a job logging to it, the server dying under
a job, the store back for the resume), started as cheaply as MLflow's own options allow."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

#: Left out of the server: MLflow's job runner (its own background jobs, which no test uses), by default a process
#: beside the web server that starts a Huey consumer a kind of job, each importing MLflow again.
NO_JOB_RUNNER = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    """``url``'s ``/health`` says 200."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def serve(folder: Path, port: int, env: dict[str, str], artifacts: Path | None = None,
          timeout: float = 120) -> subprocess.Popen:
    """``mlflow server`` on 127.0.0.1:``port`` (one web worker, no job runner) over the SQLite store
    ``folder``/server.db (the same store each time), its artifact store ``artifacts`` (``folder``/artifacts), its
    output appended to ``folder``/server.log, in a process group of its own (``kill``); returned once ``/health``
    answers."""
    url = f"http://127.0.0.1:{port}"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "server.log").open("a") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
             "--backend-store-uri", f"sqlite:///{folder / 'server.db'}", "--artifacts-destination",
             str(artifacts or folder / "artifacts"), "--workers", "1"],
            cwd=folder, env={**env, **NO_JOB_RUNNER}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not answers(url):
        if proc.poll() is not None:
            raise AssertionError(f"mlflow server exited {proc.returncode}: "
                                 f"{(folder / 'server.log').read_text()[-2000:]}")
        if time.monotonic() > deadline:
            kill(proc)
            raise AssertionError(f"mlflow server did not answer within {timeout} s")
        time.sleep(0.2)
    return proc


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the server's whole process group (its web worker too), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
