#!/usr/bin/env python
"""cupid-exp at benchmark scale (a script, not a test): CUPID's 756 instances, task=both, a stub that answers
after 0.5 s, every model at concurrency 64, MLflow tracking as in a normal run.

Reported per size (a quarter of the benchmark, then all of it, so growth is visible) and per
``runtime.workers`` value (``--workers 1 2``: processes sharing the calls; runs interleaved, ``--repeats``
times): whole-process wall, model phase against the ideal (requests × latency / concurrency), throughput,
the model phase's CPU per request (every process that made calls), peak RSS (the job, the largest other
process, the whole tree) and the size of the records the job keeps (instances.jsonl). Memory that grows
with the instances by much more than the records do would show here. The report is printed; ``--out FILE`` also
appends it (``bench/scale.md`` keeps the dated ones).

    python bench/scale.py [--sizes 189 756] [--workers 1 2] [--repeats 1] [--latency 0.5] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from versus_official import migrated_store, timed

from bench import ENV, ROOT, Stub, emit, machine, price_overrides
from cupid_exp.testing.cupid_data import stub_overrides, write_dataset


def run(size: int, args: argparse.Namespace, stub: Stub, work: Path, store: Path, workers: int = 1) -> dict:
    data = work / f"data-{size}.jsonl"
    if not data.exists():
        write_dataset(data, size)
    root = Path(tempfile.mkdtemp(prefix=f"out-{size}-w{workers}-", dir=work))
    shutil.copyfile(store, root / "mlflow.db")
    roles = ("model", "evaluator.decomposer", "evaluator.matcher", "evaluator.judge")
    cmd = [sys.executable, "-m", "cupid_exp", *stub_overrides(stub.url), *price_overrides(),
           f"task={args.task}", "data=local", f"data.path={data}", f"paths.output_root={root}",
           f"calls.cache_dir={root / 'cache'}", "runtime.progress=false",
           *[f"{r}.max_concurrency={args.concurrency}" for r in roles], f"runtime.workers={workers}", *args.overrides]
    before = stub.stats()["total_completed"]
    res = timed(cmd, cwd=ROOT, env=ENV)
    requests = stub.stats()["total_completed"] - before
    (metrics_file,) = root.glob("runs/**/metrics.json")
    metrics = json.loads(metrics_file.read_text())["metrics"]
    (records,) = root.glob("runs/**/instances.jsonl")
    ideal = requests * args.latency / args.concurrency
    return {"size": size, "workers": workers, "wall": res["wall"], "rss": res["rss_max_mb"], "requests": requests,
            "rss_main": res["rss_main_mb"], "rss_worker": res["rss_child_mb"], "rss_tree": res["rss_tree_mb"],
            "data_mb": data.stat().st_size / 2**20, "model_s": metrics["time/model_seconds"],
            "model_cpu": metrics["time/model_cpu_seconds"], "ideal": ideal,
            "records_mb": records.stat().st_size / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[189, 756])
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--task", default="both")
    parser.add_argument("--workers", type=int, nargs="+", default=[1],
                        help="runtime.workers values, each run at every size (interleaved)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each size x workers, interleaved")
    parser.add_argument("--out", type=Path, help="also append the report to this file (bench/scale.md keeps them)")
    parser.add_argument("overrides", nargs="*", help="more cupid-exp overrides for every run (e.g. tracking=none)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cupid-scale-"))
    try:
        store = migrated_store(work)
        with Stub(latency_ms=int(args.latency * 1000)) as stub:
            results = []
            for size in args.sizes:
                for _ in range(args.repeats):
                    for workers in args.workers:
                        results.append(run(size, args, stub, work, store, workers))
                        r = results[-1]
                        print(f"{size} instances, workers={workers}: {r['wall']:.1f} s wall, model phase "
                              f"{r['model_s']:.1f} s vs ideal {r['ideal']:.1f} s, {r['requests']} requests, "
                              f"{r['rss']:.0f} MB peak RSS", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    m, load = machine(), os.getloadavg()
    lines = [f"## Scale bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"`python bench/scale.py` on {time.strftime('%Y-%m-%d')}: task={args.task}, stub latency "
             f"{args.latency * 1000:.0f} ms, concurrency {args.concurrency} for every model, MLflow tracking (run, "
             f"progress, traces) into SQLite{'; overrides: ' + ' '.join(args.overrides) if args.overrides else ''}. "
             f"Machine: {m['nproc']} cores, {m['cpu']}, Python {m['python']}, litellm "
             f"{m['litellm']}, mlflow {m['mlflow']}; load average at the end {load[0]:.1f}.", "",
             "| instances | runtime.workers | requests | wall, s | model phase, s | ideal, s | model phase / ideal | "
             "requests/s | model-phase CPU ms per request (all processes) | peak RSS, MB: the job / largest other "
             "process | peak RSS of the process tree, MB | data (JSONL), MB | records (instances.jsonl), MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['size']} | {r['workers']} | {r['requests']} | {r['wall']:.1f} | {r['model_s']:.1f} | "
                     f"{r['ideal']:.1f} | {r['model_s'] / r['ideal']:.2f} | {r['requests'] / r['model_s']:.0f} | "
                     f"{1000 * r['model_cpu'] / r['requests']:.1f} | {r['rss_main']:.0f} / {r['rss_worker']:.0f} | "
                     f"{r['rss_tree']:.0f} | {r['data_mb']:.1f} | {r['records_mb']:.1f} |")
    for workers in args.workers:
        by_size = {}
        for r in results:
            if r["workers"] == workers:
                by_size.setdefault(r["size"], r)
        if len(by_size) < 2:
            continue
        a, b = by_size[min(by_size)], by_size[max(by_size)]
        lines += ["", f"runtime.workers={workers}: from {a['size']} to {b['size']} instances the job's peak RSS grew "
                      "by "
                      f"{b['rss_main'] - a['rss_main']:.0f} MB and the largest other process's by "
                      f"{b['rss_worker'] - a['rss_worker']:.0f} MB, while the data grew by "
                      f"{b['data_mb'] - a['data_mb']:.1f} MB and the records by "
                      f"{b['records_mb'] - a['records_mb']:.1f} MB "
                      "on disk."]
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
