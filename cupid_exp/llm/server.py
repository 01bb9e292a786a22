"""A local model server (vLLM for PrefMatcher): reused if already answering, else started and stopped with the job."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

from cupid_exp.config import ServerConfig
from cupid_exp.errors import ConfigError
from cupid_exp.secrets import env_snapshot

log = logging.getLogger(__name__)


def is_healthy(base_url: str, timeout: float = 2.0) -> bool:
    """True when <base_url>/v1/models answers 200."""
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/v1/models", timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


class ServerStartError(RuntimeError):
    pass


# How to install the programs the shipped configs start (conf/evaluator/prefmatcher.yaml)
INSTALL_HINTS = {"vllm": "install it with pip install -e '.[vllm]' (vLLM needs an NVIDIA GPU)"}


def check_server_command(cfg: ServerConfig | None, where: str = "evaluator.server") -> None:
    """With ``serve=true`` the command must be installed, unless a server already answers: else one ConfigError."""
    if cfg is None or not cfg.serve or not cfg.command:
        return
    program = str(cfg.command[0])
    if shutil.which(program) is not None or is_healthy(cfg.base_url):
        return
    hint = INSTALL_HINTS.get(Path(program).name, f"install it, or set {where}.command to a program that is")
    raise ConfigError(f"{where}.serve=true starts {program!r} ({where}.command), which is not installed here "
                      f"(not an executable on PATH): {hint}; or start the server yourself at {cfg.base_url} "
                      f"(one already up there is used as it is)")


@contextlib.contextmanager
def managed_server(cfg: ServerConfig | None) -> Iterator[str | None]:
    """Yield the server's base URL for the duration of a job; no-op when serving is off."""
    if cfg is None or not cfg.serve:
        yield None
        return
    if is_healthy(cfg.base_url):
        log.info("reusing the model server already up at %s", cfg.base_url)
        yield cfg.base_url
        return
    if not cfg.command:
        raise ServerStartError("evaluator.server.serve=true needs evaluator.server.command")
    log_path = Path(cfg.log_file) if cfg.log_file else None
    with open(log_path, "ab") if log_path else contextlib.nullcontext() as sink:
        log.info("starting model server: %s", " ".join(cfg.command))
        try:
            proc = subprocess.Popen(list(cfg.command), stdout=sink or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                    start_new_session=True,
                                    env={**env_snapshot(), "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
        except OSError as exc:  # removed since the check, or not executable
            raise ServerStartError(f"cannot start the model server {cfg.command[0]!r}: "
                                   f"{exc.strerror or exc}") from None
        try:
            deadline = time.monotonic() + cfg.startup_timeout
            while not is_healthy(cfg.base_url):
                if proc.poll() is not None:
                    raise ServerStartError(f"model server exited with code {proc.returncode} before becoming "
                                           "healthy" + (f"; see {log_path}" if log_path else ""))
                if time.monotonic() > deadline:
                    raise ServerStartError(f"model server not healthy at {cfg.base_url} after "
                                           f"{cfg.startup_timeout:.0f}s")
                time.sleep(0.5)
            log.info("model server healthy at %s (pid %d)", cfg.base_url, proc.pid)
            yield cfg.base_url
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
