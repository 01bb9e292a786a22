#!/usr/bin/env python
"""cupid-exp (and the official runner, when a checkout is given) against a key with OpenAI's limits (a script).

The stub server (``cupid_exp/testing/stub_llm_server.py --rpm/--tpm``, limits in ``cupid_exp/testing/rate_limits.py``)
enforces requests per minute or tokens per minute in one-second windows, answers 429 with OpenAI's headers
and body, and counts prompt + ``max_tokens`` toward TPM. A fresh stub per run, so every run meets a closed
window at the start. Reported per run: instances completed, wall time against the limit's ideal (the sum of
each admitted request's share of the binding limit, from the stub), requests and the share answered 429:

* cupid-exp with adaptation alone (no limits configured);
* cupid-exp with ``rpm``/``tpm`` set on every model config to the key's limits;
* ``--parallel N``: N cupid-exp jobs started together on the same key (one process each, one
  ``runtime.cache_dir`` for their ledger), with the limits set and without; then the same N jobs as one
  ``-m`` sweep under Hydra's joblib launcher (``hydra.launcher.n_jobs=N``), with the limits set;
* the official runner (``--official DIR --official-python PY``; skipped when absent).

    python bench/rate_limits.py --instances 30 --rpm 300
    python bench/rate_limits.py --instances 30 --tpm 400000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cupid_exp.testing.cupid_data import write_dataset

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from bench import ENV, Stub, machine  # noqa: E402
from versus_official import OFFICIAL_MODELS, official_instances, ours_command  # noqa: E402

ROLES = ("model", "evaluator.decomposer", "evaluator.matcher", "evaluator.judge")


def limit_overrides(args: argparse.Namespace) -> list[str]:
    out = []
    for role in ROLES:
        if args.rpm:
            out.append(f"{role}.rpm={args.rpm}")
        if args.tpm:
            out.append(f"{role}.tpm={args.tpm}")
    return out


def job_files(root: Path, name: str) -> list[Path]:
    """A job's ``name`` files under a single run's folder (runs/) or a sweep's (multirun/)."""
    return [f for folder in ("runs", "multirun") for f in root.glob(f"{folder}/**/{name}")]


def ours(args: argparse.Namespace, url: str, data: Path, work: Path, extra: list[str], jobs: int = 1,
         joblib: bool = False) -> dict[str, Any]:
    """``jobs`` cupid-exp processes started together, one ``runtime.cache_dir`` (their pacing ledger), no response
    cache (every job makes every call, as jobs on different models would); ``joblib``: instead one ``-m`` sweep of
    ``jobs`` jobs run side by side by Hydra's joblib launcher, as a user would start it."""
    roots = [work / f"ours-{time.monotonic_ns()}-{i}" for i in range(1 if joblib else jobs)]
    cache = work / f"cache-{time.monotonic_ns()}"
    procs = []
    start = time.perf_counter()
    for i, root in enumerate(roots):
        temperature = (f"model.params.temperature={','.join(f'{j / 10:g}' for j in range(jobs))}" if joblib
                       else f"model.params.temperature={i / 10:g}")
        cmd = ours_command(url, root, data, args.concurrency)
        if joblib:  # Hydra's --multirun flag before the overrides
            cmd[3:3] = ["-m", "hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]
        cmd += ["tracking=none", f"runtime.cache_dir={cache}", "runtime.cache=false", temperature, *extra]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env={**ENV, "OPENAI_API_KEY": "sk-bench"},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=args.limit_s)[0] for p in procs]
    wall = time.perf_counter() - start
    done = total = 0
    cpu = model_s = 0.0
    for root, out, proc in zip(roots, outputs, procs):
        records = [json.loads(x) for f in job_files(root, "instances.jsonl") for x in f.read_text().splitlines()]
        done += sum(1 for r in records if not r["errors"])
        total += args.instances * (jobs if joblib else 1)
        if proc.returncode not in (0, 3):
            print(out[-2000:])
        metrics = [json.loads(f.read_text())["metrics"] for f in job_files(root, "metrics.json")]
        cpu += sum(m.get("time/model_cpu_seconds", 0.0) for m in metrics)
        model_s = max([model_s, *(m.get("time/model_seconds", 0.0) for m in metrics)]) if metrics else model_s
    return {"wall": wall, "done": done, "total": total, "codes": [p.returncode for p in procs], "cpu": cpu,
            "model_s": model_s}


def official(args: argparse.Namespace, url: str, data_dir: Path, work: Path) -> dict[str, Any]:
    results = work / f"official-{time.monotonic_ns()}"
    env = {**ENV, "OPENAI_API_KEY": "sk-bench", "OPENAI_BASE_URL": url, "PYTHONPATH": str(args.official)}
    start = time.perf_counter()
    proc = subprocess.run([args.official_python, "-m", "evaluation.run", "--results_dir", str(results), "--model",
                           OFFICIAL_MODELS[0], "--data_dir", str(data_dir), "--n_workers", str(args.concurrency),
                           "--task", "inference", "--log_file", str(work / "official.log")],
                          cwd=args.official, env=env, capture_output=True, text=True, timeout=args.limit_s)
    wall = time.perf_counter() - start
    folder = results / OFFICIAL_MODELS[0]
    done = sum(1 for f in folder.rglob("*.json") if f.name != "results.json" and "inference" in f.read_text())
    return {"wall": wall, "done": done, "total": args.instances, "codes": [proc.returncode], "cpu": 0.0,
            "model_s": None}


def measured(run: dict[str, Any], stub: Stub) -> dict[str, Any]:
    st = stub.stats()
    run.update(requests=st["total_received"], limited=st["rate_limited"], ideal=st["limits_ideal_s"])
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, default=30)
    p.add_argument("--latency", type=float, default=0.2)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rpm", type=float, default=0.0)
    p.add_argument("--tpm", type=float, default=0.0)
    p.add_argument("--parallel", type=int, default=4, help="N jobs side by side on one key (0: skip)")
    p.add_argument("--official", type=Path, default=os.environ.get("CUPID_OFFICIAL_DIR"))
    p.add_argument("--official-python", default=sys.executable)
    p.add_argument("--limit-s", type=float, default=900.0)
    p.add_argument("--out", type=Path, default=None, help="append the table to this markdown file")
    args = p.parse_args()
    if not (args.rpm or args.tpm):
        p.error("give --rpm and/or --tpm")
    has_official = args.official is not None and (Path(args.official) / "evaluation" / "run.py").is_file()
    work = Path(tempfile.mkdtemp(prefix="cupid-limits-"))
    rows: list[tuple[str, dict[str, Any]]] = []
    stub_opts = dict(latency_ms=int(args.latency * 1000), model_ids=",".join(OFFICIAL_MODELS), rpm=args.rpm,
                     tpm=args.tpm)
    try:
        data = write_dataset(work / "data.jsonl", args.instances)
        runs = [("cupid-exp, adaptation alone", lambda url: ours(args, url, data, work, [])),
                ("cupid-exp, rpm/tpm set", lambda url: ours(args, url, data, work, limit_overrides(args)))]
        if args.parallel:
            runs.append((f"cupid-exp, {args.parallel} jobs in parallel, rpm/tpm set",
                         lambda url: ours(args, url, data, work, limit_overrides(args), jobs=args.parallel)))
            runs.append((f"cupid-exp, {args.parallel} jobs in parallel, adaptation alone",
                         lambda url: ours(args, url, data, work, [], jobs=args.parallel)))
            runs.append((f"cupid-exp, a joblib sweep of {args.parallel} jobs, rpm/tpm set",
                         lambda url: ours(args, url, data, work, limit_overrides(args), jobs=args.parallel,
                                          joblib=True)))
        if has_official:
            data_dir = official_instances(data, work / "official-data")
            runs.insert(0, ("official runner", lambda url: official(args, url, data_dir, work)))
        for name, run in runs:
            with Stub(**stub_opts) as stub:
                rows.append((name, measured(run(stub.url), stub)))
            r = rows[-1][1]
            print(f"{name}: {r['done']}/{r['total']} done, {r['wall']:.1f} s, model phase {r['model_s']} s "
                  f"(ideal {r['ideal']:.1f} s), "
                  f"{r['limited']}/{r['requests']} answered 429, exit {r['codes']}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    m, load = machine(), os.getloadavg()
    limit = " and ".join(x for x in (f"{args.rpm:g} RPM" if args.rpm else "", f"{args.tpm:g} TPM" if args.tpm else "")
                         if x)
    lines = ["", f"## {args.instances} instances at {limit}", "",
             f"`python bench/rate_limits.py --instances {args.instances}"
             + (f" --rpm {args.rpm:g}" if args.rpm else "") + (f" --tpm {args.tpm:g}" if args.tpm else "")
             + f"` on {time.strftime('%Y-%m-%d %H:%M')}: task=inference, model=gpt4o evaluator=gpt4o, stub latency "
             f"{args.latency * 1000:.0f} ms, concurrency {args.concurrency}; {m['nproc']} cores, load average at the "
             f"end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}. Ideal: the sum of each admitted request's share of "
             "the binding limit (the stub's count).", "",
             "| run | instances completed | wall, s | model phase, s | ideal, s | model phase (wall) / ideal | requests "
             "| answered 429 |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in rows:
        phase = f"{r['model_s']:.1f}" if r["model_s"] else "–"
        ratio = (f"{r['model_s'] / r['ideal']:.2f} ({r['wall'] / r['ideal']:.2f})" if r["model_s"] and r["ideal"]
                 else f"({r['wall'] / r['ideal']:.2f})" if r["ideal"] else "–")
        lines.append(f"| {name} | {r['done']}/{r['total']} ({100 * r['done'] / r['total']:.0f}%) | {r['wall']:.1f} | "
                     f"{phase} | {r['ideal']:.1f} | {ratio} | {r['requests']} | {r['limited']} "
                     f"({100 * r['limited'] / max(1, r['requests']):.1f}%) |" if r["ideal"] else
                     f"| {name} | {r['done']}/{r['total']} | {r['wall']:.1f} | – | – | {r['requests']} | {r['limited']} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out is not None:
        with args.out.open("a") as f:
            f.write(report)


if __name__ == "__main__":
    main()
