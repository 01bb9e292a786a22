"""Run the real CLI (``python -m cupid_exp``) against the stub server, or the same command in this process against
the in-process model (``run_job``), and read what it wrote."""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

from cupid_exp.testing.cupid_data import stub_overrides
from cupid_exp.testing.inprocess import InProcessModel
from helpers import sweep_workers

PROJECT_ROOT = Path(__file__).resolve().parents[2]

# What decides an instance's result; timing, usage and raw attempts are left out of comparisons.
SCORING_FIELDS = ("key", "persona_id", "instance_type", "inferred_preference", "inferred_checklist",
                  "precision_labels", "recall_labels", "n_predicted", "n_true", "predicted_matched", "true_matched",
                  "precision", "recall", "f1", "response", "judge_score", "gt_checklist")


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a CLI run: this process's, less any ``MLFLOW_TRACKING_URI`` (an in-process test's
    ``mlflow.set_tracking_uri`` exports it, and a module fixture runs before the per-test cleanup), plus ``extra``."""
    inherited = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return {**inherited, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1", **extra}


_TEMPLATE_STORE: Path | None = None


def seed_store(output_root: Path) -> None:
    """Give a test's output root an empty, already-migrated MLflow store: creating one runs MLflow's schema
    migrations (~2-3 s a store), which every CLI test would otherwise pay. The CLI's own store creation is
    tested where it matters (tests/test_parallel.py, fresh stores)."""
    global _TEMPLATE_STORE
    if _TEMPLATE_STORE is None:
        from mlflow.tracking import MlflowClient

        folder = Path(tempfile.mkdtemp(prefix="cupid-mlflow-template-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        MlflowClient(f"sqlite:///{folder / 'mlflow.db'}").search_experiments(max_results=1)
        _TEMPLATE_STORE = folder / "mlflow.db"
    target = Path(output_root) / "mlflow.db"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_TEMPLATE_STORE, target)


def cli_command(url: str | InProcessModel, output_root: Path, *extra: str, cache_dir: Path | None = None,
                data: Path | None = None, seed: bool = True) -> list[str]:
    """The CLI against the stub at ``url`` (or an in-process model), writing under ``output_root`` (its MLflow store
    pre-created when the job will track into the default SQLite file and ``seed`` is on)."""
    if seed and not {"tracking=none", "calls.dry_run=true"} & set(extra):
        seed_store(output_root)
    target = url.overrides() if isinstance(url, InProcessModel) else stub_overrides(url)
    cmd = [sys.executable, "-m", "cupid_exp", *target, f"paths.output_root={output_root}",
           "runtime.progress=false"]
    if cache_dir is not None:
        cmd.append(f"calls.cache_dir={cache_dir}")
    if data is not None:
        cmd += ["data=local", f"data.path={data}"]
    return cmd + list(extra)


def run_cli(cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env or cli_env(), capture_output=True, text=True,
                          timeout=timeout)
    if check:
        assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")
_PROGRAMS = {"cupid_exp": "cupid_exp.cli", "cupid_exp.synthesize": "cupid_exp.synthesize"}  # ``-m`` -> its main
_WORKER: Any = None  # the MLflow run worker ``run_job``'s runs share, as a sweep's jobs do (its start: ~3-5 s)


_KEPT_OUTPUT: list[int] = []  #: fds 1 and 2 of the in-process runs whose processes may be kept (``_printed``)


def _output_files() -> list[int]:
    """Two unlinked files, opened for appending (a writer that shares them writes at their end)."""
    folder = tempfile.mkdtemp(prefix="cupid-printed-")
    files = []
    for name in ("stdout", "stderr"):
        path = os.path.join(folder, name)
        files.append(os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600))
        os.unlink(path)
    os.rmdir(folder)
    return files


@contextlib.contextmanager
def _printed(kept: bool = False) -> Iterator[list[str]]:
    """File descriptors 1 and 2 sent to files while the block runs, and ``sys.stdout``/``sys.stderr`` written straight
    to them (unbuffered, as ``cli_env``'s ``PYTHONUNBUFFERED``): what the job prints, and what its worker processes, a
    sweep's loky workers or C code write to the descriptors, is read back as a subprocess's output would be (the
    list, once the block ends: stdout, stderr). ``kept``: processes started in the block may outlive it (a sweep's
    kept loky workers): the files are this process's one pair for such blocks, each reading what they gained while it
    ran, so what a kept process says in a later block is read by that block."""
    if kept and not _KEPT_OUTPUT:
        _KEPT_OUTPUT.extend(_output_files())
    files = _KEPT_OUTPUT if kept else _output_files()
    starts = [os.fstat(fd).st_size for fd in files]
    streams = sys.stdout, sys.stderr
    for stream in streams:
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    printed: list[str] = []
    try:
        for fd, file in zip((1, 2), files, strict=True):
            os.dup2(file, fd)
        sys.stdout, sys.stderr = (io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                                   errors="backslashreplace", write_through=True) for fd in (1, 2))
        yield printed
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        sys.stdout, sys.stderr = streams
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)
        for file, start in zip(files, starts, strict=True):
            written = os.pread(file, os.fstat(file).st_size - start, start)
            printed.append(written.decode("utf-8", errors="backslashreplace"))
            if not kept:
                os.close(file)


def run_job(cmd: list[str], *, env: dict[str, str] | None = None, check: bool = True, park: bool = True,
            cwd: Path | None = None, keep_sweep_workers: bool = False, **_: Any) -> subprocess.CompletedProcess:
    """``cmd`` (``cli_command``'s) run as ``run_cli`` runs it, but in this process: the same entry, exit code and
    printed lines (``_printed``: its worker processes' too), without a new Python and litellm's import (~3 s each).
    For what needs no process of its own: signals, kills, locks and exit by ``os._exit`` stay with ``run_cli``.
    ``env`` is set for the run only, and so is ``cwd`` (the working folder; this process's by default). ``park``: the
    job's MLflow run worker waits for the next ``run_job`` (its start: ~3-5 s); off, it is a fresh one, quit when the
    job ends, as at a process's exit (a parked worker writes into the output of the run that started it, so later
    runs would not read what it prints); a joblib sweep's loky workers are stopped at the end, as the process's exit
    (``entry.exit_now``) stops them, unless ``keep_sweep_workers`` (``helpers.sweep_workers``: the next such run
    takes them, each starting its command as this process does: no pool or MLflow run worker of an earlier one)."""
    import importlib
    import logging
    import signal

    from hydra.core.global_hydra import GlobalHydra

    from cupid_exp.entry import reset_entry
    from cupid_exp.llm.pools import forget_pools
    from cupid_exp.tracking import run_worker

    global _WORKER

    assert cmd[1] == "-m" and cmd[2] in _PROGRAMS, cmd[:3]
    main = importlib.import_module(_PROGRAMS[cmd[2]]).main
    # what the run's own variables and the entry set (not what a library sets for the process: litellm's tokenizer
    # folder, set when it is first imported, must stay)
    saved_env = {k: os.environ.get(k) for k in {*(env or {}), "MLFLOW_TRACKING_URI", "PYTHONWARNINGS"}}
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    handlers = {name: signal.getsignal(getattr(signal, name)) for name in _SIGNALS}
    raise_exceptions, root_handlers, root_level = logging.raiseExceptions, logging.root.handlers[:], logging.root.level
    import litellm

    from cupid_exp.llm import client

    # the job sets litellm's response cache for the process (``client.configure_litellm``): put back after
    cache = litellm.cache, client._CACHE_DIR
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # as ``cli_env`` leaves it out
    os.environ.update({k: v for k, v in (env or {}).items() if os.environ.get(k) != v})
    sys.argv = [cmd[2], *cmd[3:]]
    if cwd is not None:
        os.chdir(cwd)
    reset_entry()
    forget_pools()  # a new process's: no answers, failures or pace learned by an earlier run
    GlobalHydra.instance().clear()
    start = run_worker.start
    if park:
        run_worker.start = lambda keep=False: start(keep=True)  # parked when its run ends, for the next run_job
        run_worker._IDLE, _WORKER = _WORKER, None
    try:
        with _printed(kept=keep_sweep_workers) as printed:
            try:
                sweep_workers.before(keep_sweep_workers)
                code = main.run()
            finally:  # what the process's exit does, while its output is still read
                sweep_workers.after(keep_sweep_workers)
                if not park:
                    run_worker.quit_idle()
    finally:
        litellm.cache, client._CACHE_DIR = cache
        run_worker.start = start
        if park:
            run_worker._IDLE, _WORKER = None, run_worker._IDLE
        sys.argv = saved_argv
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        os.chdir(saved_cwd)
        for name, handler in handlers.items():
            signal.signal(getattr(signal, name), handler)
        logging.raiseExceptions = raise_exceptions
        for handler in set(logging.root.handlers) - set(root_handlers):  # the job's log file and console, Hydra's
            handler.close()
        logging.root.handlers[:] = root_handlers
        logging.root.setLevel(root_level)
        GlobalHydra.instance().clear()
        reset_entry()
    proc = subprocess.CompletedProcess(cmd, code, *printed)
    if check:
        assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every line must be one JSON object (raises on a half-written line)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "", f"{path} does not end with a newline"
    return [json.loads(line) for line in lines[:-1]]


def job_dirs(output_root: Path) -> list[Path]:
    """Hydra job directories (single runs and sweep jobs) that hold an instances.jsonl (not MLflow's copies)."""
    roots = [output_root] if output_root.name in ("runs", "multirun") else [output_root / "runs",
                                                                            output_root / "multirun"]
    return sorted(p.parent for root in roots for p in root.glob("**/instances.jsonl") if (p.parent / ".hydra").is_dir())


def scoring(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in records:
        row = {k: r.get(k) for k in SCORING_FIELDS}
        row["errors"] = sorted((e["step"], e["kind"]) for e in r.get("errors", []))
        out.append(row)
    return out


def metrics_of(job_dir: Path) -> dict[str, float]:
    return json.loads((job_dir / "metrics.json").read_text())["metrics"]
