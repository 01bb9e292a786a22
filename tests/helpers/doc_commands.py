"""Commands of the docs' bash blocks, and running one as tests/test_readme.py declares it (see there)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from cupid_exp.testing.stub_llm_server import StubServer
from helpers.cli_runner import _PROGRAMS, PROJECT_ROOT, run_job
from helpers.mlflow_server import NO_JOB_RUNNER, free_port

DOCS = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
LINKED = ("cupid_exp", "conf", "prompts", "bench", "docs", "scripts", "tests", "pyproject.toml")
SAMPLE_FULL = "cupid_exp/data/sample/cupid_sample_full.jsonl"

# Fake keys: a command that reaches a provider must reach the stub, never a real one.
KEYS = {name: f"fake-{name.lower()}" for name in (
    "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "TOGETHER_API_KEY", "TOGETHERAI_API_KEY", "GEMINI_API_KEY",
    "GOOGLE_API_KEY", "VERTEXAI_PROJECT", "VERTEXAI_LOCATION", "OPENAI_COMPATIBLE_API_KEY")}
FAST = "data.limit=1 tracking=none"  # one instance, no MLflow worker: the command composes, plans and runs
SYNTH_ROLES = ("persona_writer", "factor_writer", "session_writer", "user_simulator", "assistant_simulator",
               "decomposer", "validator")


def at_stub(url: str) -> list[str]:
    """The evaluated model and the evaluator's roles sent to the stub; choices and decoding stay as composed (an
    embedded model's ``local`` section is dropped: it would load the model)."""
    out = ["runtime.progress=false"]
    for node in ("model", "evaluator.decomposer", "evaluator.matcher", "evaluator.judge"):
        out += [f"{node}.litellm_model=openai/stub", f"{node}.api_base={url}", f"{node}.local=null"]
    return out


def bases_at_stub(url: str) -> list[str]:
    """Only the addresses sent to the stub: the litellm providers (and the keys they need) stay as shipped."""
    return ["runtime.progress=false", f"model.api_base={url}",
            *(f"evaluator.{role}.api_base={url}" for role in ("decomposer", "matcher", "judge"))]


def synthesis_at_stub(url: str) -> list[str]:
    """Every synthesis role on the stub, which answers synthesis steps from the request's JSON schema."""
    out = ["runtime.progress=false", "synthesis.max_checklist_items=2"]
    for role in SYNTH_ROLES:
        out += [f"synthesis.roles.{role}.litellm_model=openai/stub", f"synthesis.roles.{role}.api_base={url}",
                f"synthesis.roles.{role}.structured_output=true", f"synthesis.roles.{role}.local=null"]
    return out


@dataclass(frozen=True)
class Expect:
    exit: int = 0
    stub: str = ""           # "eval": model and evaluator roles on the stub; "base": only their api_base (the
                             # providers stay as shipped); "synth": the synthesis roles
    extra: str = ""          # overrides appended (cheaper: FAST)
    instead: str = ""        # a cheaper equivalent run in its place; `why` says why
    why: str = ""
    one_line: str = ""       # stderr is exactly one line, and it contains this
    stderr_has: str = ""     # stderr contains this and no traceback (sweeps: one line per job, then the list)
    stdout_has: str = ""
    server: bool = False     # a server: started on a free port, must answer /health, then stopped
    skip: str = ""           # not run here, and why
    slow: bool = False
    no_calls: bool = False   # the stub must receive no request (the command is stubbed to catch any)
    capture: tuple[str, str] = ("", "")  # (placeholder, regex on stdout) for later commands of the block
    check: str = ""          # name of an extra check in CHECKS
    short_ids: bool = False  # RUN_A, RUN_B as the report prints them (8 characters) instead of whole ids


def _strip_comment(line: str) -> str:
    """``line`` without a trailing shell comment (a ``#`` after a blank, outside quotes)."""
    quote, prev = "", " "
    for i, ch in enumerate(line):
        if quote:
            if ch == quote and (quote == "'" or prev != "\\"):
                quote = ""
        elif ch in "'\"" and prev != "\\":
            quote = ch
        elif ch == "#" and prev in " \t":
            return line[:i].rstrip()
        prev = ch
    return line.rstrip()


def split_commands(block: str) -> list[str]:
    """The commands of a bash block: continuations joined, here-documents kept whole, comments dropped."""
    lines, out, i = block.split("\n"), [], 0
    while i < len(lines):
        line, i = lines[i], i + 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.rstrip().endswith("\\") and i < len(lines):
            line, i = line.rstrip()[:-1].rstrip() + " " + lines[i].strip(), i + 1
        line = _strip_comment(line)
        heredoc = re.search(r"<<-?'?\"?(\w+)", line)
        if heredoc:
            end = lines.index(heredoc.group(1), i)
            line, i = "\n".join([line, *lines[i:end], heredoc.group(1)]), end + 1
        out.append(line)
    return out


def key_of(command: str) -> str:
    """A command's declaration key: its first line, blanks collapsed."""
    return " ".join(command.split("\n", 1)[0].split())


def blocks() -> list[tuple[str, list[str]]]:
    """(where, commands) for every bash block of the docs, in order."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"^```bash\n(.*?)^```", text, re.M | re.S):
            line = text[:m.start()].count("\n") + 1
            found.append((f"{doc.relative_to(PROJECT_ROOT)}:{line}", split_commands(m.group(1))))
    return found


@dataclass
class Workspace:
    root: Path
    stub: StubServer
    env: dict[str, str]


def _serve(command: str, ws: Workspace) -> None:
    """Start a server command on a free port (its folders under the workspace), wait for /health, stop it. An MLflow
    server starts without its job runner (``NO_JOB_RUNNER``: processes no command here uses)."""
    port = free_port()
    command = command.replace("/srv/mlflow", str(ws.root / "srv"))
    command = (command.replace("--port 5000", f"--port {port}") if "--port 5000" in command
               else f"{command} --port {port}")
    (ws.root / "srv").mkdir(exist_ok=True)
    proc = subprocess.Popen(["bash", "-c", command], cwd=ws.root, env={**ws.env, **NO_JOB_RUNNER},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"{command} exited {proc.returncode}: {proc.stdout.read()[-2000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        pytest.fail(f"{command} did not answer /health within 90 s")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def in_process_argv(command: str) -> list[str] | None:
    """The arguments of ``command`` when it is ``python -m`` of a program ``run_job`` runs (``cupid_exp``,
    ``cupid_exp.synthesize``) with nothing for the shell to do but split words (no variable, substitution,
    operator, redirection, brace, tilde or wildcard; a ``[...]`` override matches no file in the workspace): such a
    command runs in this process, as its own would (the same entry, exit code and printed lines), without a new
    Python importing litellm. Else None: the shell runs it."""
    if re.search(r"[$`\\|&;<>(){}*?~]", command) or "\n" in command:
        return None
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if len(argv) < 3 or argv[:2] != ["python", "-m"] or argv[2] not in _PROGRAMS:
        return None
    return [sys.executable, *argv[1:]]


def run_doc_command(command: str, ws: Workspace, timeout: float = 300) -> subprocess.CompletedProcess:
    """``command`` as the docs give it, from the workspace: in this process where it can be (``in_process_argv``),
    else by ``bash -c``."""
    argv = in_process_argv(command)
    if argv is not None:
        return run_job(argv, env=ws.env, check=False, park=False, cwd=ws.root)
    return subprocess.run(["bash", "-c", command], cwd=ws.root, env=ws.env, capture_output=True, text=True,
                          timeout=timeout)


_PASSED: set[str] = set()  # commands already run as declared in this process (a command quoted twice runs once)


def run_command(command: str, expect: Expect, ws: Workspace, values: dict[str, str],
                checks: dict[str, Callable[[subprocess.CompletedProcess, "Workspace"], None]]) -> None:
    key = key_of(command)
    if key in _PASSED and not expect.capture[0]:
        return
    if expect.instead:
        command = expect.instead
    for name, value in values.items():
        short = expect.short_ids and name in ("RUN_A", "RUN_B")
        command = command.replace(name, value[:8] if short else value)
    if expect.server:
        _serve(" ".join([command, *expect.extra.split()]), ws)
        _PASSED.add(key)
        return
    appended = {"eval": at_stub(ws.stub.url), "base": bases_at_stub(ws.stub.url),
                "synth": synthesis_at_stub(ws.stub.url), "": []}[expect.stub]
    appended = [*appended, *expect.extra.split()]
    if appended:
        command += " " + " ".join(shlex.quote(a) for a in appended)
    before = ws.stub.stats()["total_received"] if expect.no_calls else None
    proc = run_doc_command(command, ws)
    said = f"\n$ {command}\nexit {proc.returncode}\nstdout: {proc.stdout[-2500:]}\nstderr: {proc.stderr[-2500:]}"
    assert proc.returncode == expect.exit, said
    if expect.one_line:
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and expect.one_line in lines[0], said
    if expect.stderr_has:
        assert expect.stderr_has in proc.stderr and "Traceback" not in proc.stderr, said
    if expect.stdout_has:
        assert expect.stdout_has in proc.stdout, said
    if expect.no_calls:
        assert ws.stub.stats()["total_received"] == before, "a request was sent" + said
    if expect.capture[0]:
        m = re.search(expect.capture[1], proc.stdout, re.M)
        assert m, said
        values[expect.capture[0]] = m.group(1)
    if expect.check:
        checks[expect.check](proc, ws)
    _PASSED.add(key)
