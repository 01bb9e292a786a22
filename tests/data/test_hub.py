"""``data=cupid`` when the Hub cannot be had, through the real CLI: one line saying what to do, exit 2, at once
(offline declared) or after one bounded try (the network fails), and in a sweep the job is in the closing list.
A copy in the Hugging Face cache still loads offline."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.cli_runner import PROJECT_ROOT, cli_env

OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
SAMPLE = PROJECT_ROOT / "cupid_exp" / "data" / "sample" / "cupid_sample.jsonl"


def hub_env(tmp_path: Path, *, offline: bool, **extra: str) -> dict[str, str]:
    """The CLI's environment with an empty Hugging Face cache of its own (this machine's cache plays no part)."""
    env = cli_env(HF_HOME=str(tmp_path / "hf"), HF_DATASETS_CACHE=str(tmp_path / "hf" / "datasets"), **extra)
    for name in OFFLINE:
        env.pop(name, None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def run(tmp_path: Path, env: dict[str, str], *overrides: str, sweep: bool = False,
        timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [sys.executable, "-m", "cupid_exp", *(["-m"] if sweep else []), "data=cupid", "tracking=none",
           "runtime.progress=false",
           f"paths.output_root={tmp_path / 'outputs'}", *overrides]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("cupid_exp: ")]


def test_offline_without_a_cached_copy_is_one_line_exit_2_at_once(tmp_path: Path) -> None:
    proc, seconds = run(tmp_path, hub_env(tmp_path, offline=True))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    (line,) = error_lines(proc)
    assert line.startswith("cupid_exp: data=cupid: kixlab/CUPID is not in the Hugging Face cache and HF_HUB_OFFLINE=1")
    assert "data=local data.path=" in line
    assert seconds < 60  # no retries: the start-up of the process, on a loaded machine


@pytest.fixture
def black_hole():
    """A port that takes connections and never answers: a Hub behind a network that drops replies."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


def test_an_unreachable_hub_is_one_line_exit_2_after_one_bounded_try(tmp_path: Path, black_hole: str) -> None:
    """Without the probe, huggingface_hub's backoff retried for minutes here (and ~24 s when the name does not
    resolve), then ended in a traceback."""
    env = hub_env(tmp_path, offline=False, HF_ENDPOINT=black_hole, HF_HUB_ETAG_TIMEOUT="2")
    proc, seconds = run(tmp_path, env, timeout=90)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    (line,) = error_lines(proc)
    assert f"cannot reach the Hugging Face Hub at {black_hole} to load kixlab/CUPID" in line
    assert "tried once, HF_HUB_ETAG_TIMEOUT=2 s" in line
    assert "data=local data.path=" in line and "HF_HUB_OFFLINE=1" in line
    assert seconds < 60


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_sweep_says_once_that_its_jobs_could_not_load_the_hub(tmp_path: Path, dry_run: bool) -> None:
    """Three jobs refused for one reason: said when the first is refused, then once in the sweep's closing list
    (it was said for every job, twice: 41 lines for table1's 20 jobs); each job's cli.log holds it; a dry run
    prints no total over zero jobs."""
    proc, _ = run(tmp_path, hub_env(tmp_path, offline=True), "data.limit=1,2,3", f"calls.dry_run={dry_run}",
                  sweep=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    reason = "data=cupid: kixlab/CUPID is not in the Hugging Face cache"
    statuses = [json.loads(p.read_text()) for p in (tmp_path / "outputs").glob("multirun/**/job_status.json")]
    assert [s["outcome"] for s in statuses] == ["error"] * 3 and all(reason in s["reason"] for s in statuses)
    assert proc.stderr.count(reason) == 2, proc.stderr
    listed = proc.stderr.split("sweep: 3 of 3 jobs did not complete:")[1].strip().splitlines()
    assert len(listed) == 1 and listed[0].startswith("3 jobs refused (0_") and f"): {reason}" in listed[0]
    logs = {Path(s["folder"]) / "cli.log" for s in statuses}  # each job's own folder, which its status names
    assert len(logs) == 3 and all(reason in log.read_text() for log in logs)
    assert "sweep total over 0 jobs" not in proc.stdout
    assert ("DRY RUN: no job of the sweep was estimated (3 of 3 refused" in proc.stdout) == dry_run


def _cache_like_a_download(cache: Path) -> None:
    """Prepare the sample as ``datasets`` leaves kixlab/CUPID in its cache after a download (Arrow files under
    ``kixlab___cupid/default/<version>/<hash>``), which is what offline mode reads."""
    import pandas as pd
    from datasets.packaged_modules.parquet.parquet import Parquet

    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    parquet = cache.parent / "test.parquet"
    parquet.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(parquet)
    staging = cache.parent / "staging"
    Parquet(cache_dir=str(staging), data_files={"test": str(parquet)}, dataset_name="cupid",
            hash="0123abcd").download_and_prepare()
    (prepared,) = (staging / "cupid").iterdir()  # default-<data files hash>
    (cache / "kixlab___cupid").mkdir(parents=True)
    prepared.rename(cache / "kixlab___cupid" / "default")


def test_offline_with_the_data_set_in_the_cache_loads_it(tmp_path: Path) -> None:
    env = hub_env(tmp_path, offline=True)
    _cache_like_a_download(Path(env["HF_DATASETS_CACHE"]))
    proc, _ = run(tmp_path, env, "calls.dry_run=true")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "3 instances from kixlab/CUPID" in proc.stdout + proc.stderr
