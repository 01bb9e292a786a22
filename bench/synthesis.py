#!/usr/bin/env python
"""Synthesis at scale (a script, not a test): ``python -m cupid_exp.synthesize synthesis=api`` with every role on the
stub (schema-valid JSON after ``--latency`` seconds), every role's ``max_concurrency`` at ``--concurrency``, MLflow
tracking as in a normal run (run, progress, a trace per persona) into a migrated SQLite store.

Reported per size: whole-process wall; start-up (from the command to the stub's first request, polled every
20 ms); the calls and the ideal (calls x latency / concurrency); wall against ``1.3 x ideal + start-up`` (issue 35's
bound); peak and mean requests in flight (mean: the stub's busy time over the model phase); instances, failed
personas; CPU of the whole process tree (``os.wait4``) and of the model phase. The report is printed; ``--out FILE``
also appends it (``bench/synthesis.md`` keeps the dated ones).

    python bench/synthesis.py [--sizes 40 252] [--latency 0.5] [--concurrency 64] [--repeats 1] [overrides...]

Needs a quiet machine for numbers worth quoting (``uptime``'s load average under 0.5): at 64 calls in flight and
0.5 s a call the client makes ~128 calls a second, a few milliseconds of CPU each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from versus_official import migrated_store, timed

from bench import ENV, ROOT, Stub, emit, machine

ROLES = ("persona_writer", "factor_writer", "session_writer", "user_simulator", "assistant_simulator", "decomposer",
         "validator")
BOUND, STARTUP_BOUND_S = 1.3, 6.0  #: wall <= BOUND x ideal + start-up, start-up <= 6 s (issue 35)
ITEM6 = 1.15  #: issue 43 item 6: wall <= ITEM6 x ideal + start-up


def role_overrides(url: str, concurrency: int) -> list[str]:
    out = []
    for role in ROLES:
        out += [f"llm@synthesis.roles.{role}=openai_compatible", f"synthesis.roles.{role}.litellm_model=openai/stub",
                f"synthesis.roles.{role}.api_base={url}", f"synthesis.roles.{role}.structured_output=true",
                f"synthesis.roles.{role}.max_concurrency={concurrency}"]
    return out


def first_request(stub: Stub, started: float, done: threading.Event) -> list[float]:
    """Seconds from ``started`` to the stub's first request (polled), in a list filled by a thread."""
    seen: list[float] = []

    def poll() -> None:
        while not done.is_set():
            if stub.stats()["total_received"] > 0:
                seen.append(time.perf_counter() - started)
                return
            time.sleep(0.02)

    threading.Thread(target=poll, daemon=True).start()
    return seen


def mean_latency(args: argparse.Namespace) -> float:
    """A reply's mean latency: ``--latency`` plus half the uniform ``--jitter``."""
    return args.latency + args.jitter / 2


def run(size: int, args: argparse.Namespace, stub: Stub, work: Path, store: Path) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"synth-{size}-", dir=work))
    shutil.copyfile(store, root / "mlflow.db")
    cmd = [sys.executable, "-m", "cupid_exp.synthesize", "synthesis=api", *role_overrides(stub.url, args.concurrency),
           f"synthesis.n_personas={size}", f"paths.output_root={root}", f"calls.cache_dir={root / 'cache'}",
           "runtime.progress=false", *args.overrides]
    stub.reset()
    done = threading.Event()
    started = time.perf_counter()
    seen = first_request(stub, started, done)
    res = timed(cmd, cwd=ROOT, env=ENV)
    done.set()
    stats = stub.stats()
    (metrics_file,) = root.glob("synthesis/*/metrics.json")
    metrics = json.loads(metrics_file.read_text())["metrics"]
    calls = stats["total_completed"]
    model_s = metrics["time/model_seconds"]
    ideal = calls * mean_latency(args) / args.concurrency
    startup = seen[0] if seen else float("nan")
    return {"size": size, "wall": res["wall"], "cpu": res["cpu"], "startup": startup, "calls": calls,
            "received": stats["total_received"], "ideal": ideal, "model_s": model_s,
            "model_cpu": metrics["time/model_cpu_seconds"], "peak": stats["peak_in_flight"],
            "mean": calls * mean_latency(args) / model_s if model_s else float("nan"),
            "instances": int(metrics["instances/count"]), "failed": int(metrics["personas/failed"]),
            "rss_tree": res["rss_tree_mb"], "bound": BOUND * ideal + startup}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[40, 252])
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="seconds of uniform extra latency per reply (--latency 0.3 --jitter 0.4: 0.3-0.7 s)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also append the report to this file (bench/synthesis.md keeps them)")
    parser.add_argument("overrides", nargs="*", help="more overrides for every run (e.g. runtime.workers=1)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="cupid-synth-bench-"))
    results = []
    try:
        store = migrated_store(work)
        with Stub(latency_ms=int(args.latency * 1000), jitter_ms=int(args.jitter * 1000)) as stub:
            for _ in range(args.repeats):
                for size in args.sizes:
                    r = run(size, args, stub, work, store)
                    results.append(r)
                    print(f"{size} personas: {r['wall']:.1f} s wall (bound {r['bound']:.1f}), start-up "
                          f"{r['startup']:.1f} s, {r['calls']} calls, ideal {r['ideal']:.1f} s, in flight "
                          f"{r['peak']} peak / {r['mean']:.1f} mean, {r['instances']} instances, {r['failed']} failed",
                          flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    m, load_after = machine(), os.getloadavg()
    lines = [f"## Synthesis bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"`python bench/synthesis.py --sizes {' '.join(map(str, args.sizes))} --latency {args.latency} "
             f"{f'--jitter {args.jitter} ' if args.jitter else ''}--concurrency {args.concurrency}"
             f"{' ' + ' '.join(args.overrides) if args.overrides else ''}` on "
             f"{time.strftime('%Y-%m-%d')}: `synthesis=api`, every role on the stub at {args.latency * 1000:.0f}"
             f"{f'–{(args.latency + args.jitter) * 1000:.0f}' if args.jitter else ''} ms "
             f"with `max_concurrency={args.concurrency}`, MLflow tracking into SQLite. Machine: {m['nproc']} cores, "
             f"{m['cpu']}, Python {m['python']}, litellm {m['litellm']}, mlflow {m['mlflow']}; load average "
             f"{load_before[0]:.1f} before, {load_after[0]:.1f} after.", "",
             f"Bound (issue 35): wall <= {BOUND} x ideal + start-up, start-up <= {STARTUP_BOUND_S:.0f} s; ideal = "
             "calls x mean latency / concurrency; issue 43 item 6 asks wall <= 1.15 x ideal + start-up.", "",
             "| personas | wall, s | start-up, s | calls | calls/persona | ideal, s | bound, s | within | "
             "model phase, s | in flight: peak / mean | instances | failed | CPU, s (tree) | model-phase CPU ms/call | "
             "peak RSS tree, MB | 1.15 x ideal + start-up, s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ok = r["wall"] <= r["bound"] and r["startup"] <= STARTUP_BOUND_S
        lines.append(f"| {r['size']} | {r['wall']:.1f} | {r['startup']:.1f} | {r['calls']} | "
                     f"{r['calls'] / r['size']:.0f} | {r['ideal']:.1f} | {r['bound']:.1f} | {'yes' if ok else 'NO'} | "
                     f"{r['model_s']:.1f} | {r['peak']} / {r['mean']:.1f} | {r['instances']} | {r['failed']} | "
                     f"{r['cpu']:.1f} | {1000 * r['model_cpu'] / r['calls']:.1f} | {r['rss_tree']:.0f} | "
                     f"{ITEM6 * r['ideal'] + r['startup']:.1f} |")
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
