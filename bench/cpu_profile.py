#!/usr/bin/env python
"""Where a job's CPU goes, per request served (a script): issue 36 item 4 asks for whole-process CPU per request at
most the official runner's, and a profile of what stays above it.

One ``python -m cupid_exp model=gpt4o evaluator=gpt4o task=inference`` job against the stub (as
``versus_official.py`` runs it: every role at the stub, one pool, ``max_concurrency`` C), sampled by py-spy
(``--subprocesses``: the job's process, its forked calls worker, the MLflow worker) while ``os.wait4`` measures the
process tree's CPU. Each non-idle sample is put in one bucket by the frames it holds (imports; MLflow and its
trace export; the response cache: litellm's cache layer and diskcache; litellm, the OpenAI SDK and httpx;
cupid-exp's own modules; asyncio); a bucket's share of the samples times the tree's CPU is its CPU, divided by
the requests the stub served. py-spy counts a thread that waits for the GIL as busy, so the shares are what to
read, not the sampled seconds.

    python bench/cpu_profile.py --instances 756 --latency 0.5 --concurrency 64 --py-spy /path/to/py-spy
    python bench/cpu_profile.py ... -- tracking.traces=false calls.cache=false   # overrides after --
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from versus_official import OFFICIAL_MODELS, ours_command

from bench import ENV, Stub, machine
from cupid_exp.testing.cupid_data import write_dataset

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

# a sample whose innermost frame is one of these waits (py-spy's idle detection misses some of them)
IDLE = ("Condition.wait", "Selector.select", "EpollSelector.select", "thread.py:81)", "Event.wait", "Queue.get",
        "Connection._recv", "_wait_for_tstate_lock", "sleep")
_FILE = re.compile(r"\(([^:]+):\d+\)")


def bucket(frames: list[str]) -> str | None:
    """The bucket of one sample's stack (outermost frame first); None for an idle one."""
    if not frames or any(w in frames[-1] for w in IDLE):
        return None
    files = " ".join(m.group(1) for f in frames if (m := _FILE.search(f)))
    if any("_find_and_load" in f for f in frames):
        return "imports (start-up, first use)"
    if "mlflow/" in files or "sqlalchemy" in files or "trace_batches" in files:
        return "MLflow: run, metrics, trace export"
    if "diskcache" in files or "response_cache" in files or "litellm/caching" in files:
        return "response cache (litellm's cache layer, diskcache)"
    if any(p in files for p in ("litellm/", "openai/", "httpx/", "httpcore/", "pydantic")):
        return "litellm, the OpenAI SDK, httpx (the call itself)"
    own = [f for f in files.split() if "cupid_exp/" in f]
    if own:
        return "cupid-exp: " + "/".join(own[-1].split("cupid_exp/")[1].split("/")[:2])
    if "asyncio/" in files:
        return "asyncio event loop"
    return "other"


def read_samples(path: Path, job_pid: int) -> tuple[collections.Counter, collections.Counter]:
    """Samples per bucket and per process (the job's, a calls worker, the MLflow worker) from py-spy's raw output."""
    buckets: collections.Counter = collections.Counter()
    processes: collections.Counter = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        procs = [f for f in frames if f.startswith("process ")]
        where = bucket([f for f in frames if not f.startswith("process ")])
        if where is None or not procs:
            continue
        last = procs[-1]
        who = ("job" if last.startswith(f"process {job_pid}:") else
               "MLflow worker" if "spawn_main" in last else "calls worker")
        buckets[where] += int(count)
        processes[who] += int(count)
    return buckets, processes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, default=756)
    p.add_argument("--latency", type=float, default=0.5)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    p.add_argument("--rate", type=int, default=200, help="samples a second")
    p.add_argument("--stacks", type=Path, help="also keep py-spy's raw samples (one folded stack a line) here")
    p.add_argument("overrides", nargs="*", help="cupid-exp overrides (after --)")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cupid-cpu-"))
    try:
        data = write_dataset(work / "data.jsonl", args.instances)
        with Stub(latency_ms=int(args.latency * 1000), model_ids=",".join(OFFICIAL_MODELS)) as stub:
            cmd = ours_command(stub.url, work / "out", data, args.concurrency) + args.overrides
            start = time.perf_counter()
            job = subprocess.Popen(cmd, cwd=ROOT, env={**ENV, "OPENAI_API_KEY": "sk-bench"},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            spy = subprocess.Popen([args.py_spy, "record", "--pid", str(job.pid), "--subprocesses", "--rate",
                                    str(args.rate), "--format", "raw", "-o", str(work / "stacks.txt")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _, status, usage = os.wait4(job.pid, 0)
            wall = time.perf_counter() - start
            spy.wait(timeout=60)
            requests = stub.stats()["total_completed"]
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"the job failed (exit {os.waitstatus_to_exitcode(status)})")
        cpu = usage.ru_utime + usage.ru_stime
        buckets, processes = read_samples(work / "stacks.txt", job.pid)
        if args.stacks:
            shutil.copyfile(work / "stacks.txt", args.stacks)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = sum(buckets.values())
    m, load = machine(), os.getloadavg()
    print(f"`python bench/cpu_profile.py {' '.join(sys.argv[1:])}` on {time.strftime('%Y-%m-%d %H:%M')}: "
          f"{args.instances} instances, stub latency {args.latency * 1000:.0f} ms, concurrency {args.concurrency}; "
          f"{m['nproc']} cores, {m['cpu']}, litellm {m['litellm']}; load average at the end {load[0]:.1f}. "
          f"Wall {wall:.1f} s, process tree CPU {cpu:.1f} s, {requests} requests: "
          f"**{1000 * cpu / requests:.2f} ms of CPU per request**. Samples by process: "
          + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in processes.most_common()) + ".\n")
    print("| where | share of samples | CPU per request, ms |\n|---|---|---|")
    for name, n in buckets.most_common():
        if n / total >= 0.005:
            print(f"| {name} | {100 * n / total:.1f}% | {1000 * cpu * n / total / requests:.2f} |")


if __name__ == "__main__":
    main()
