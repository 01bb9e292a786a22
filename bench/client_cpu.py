#!/usr/bin/env python
"""CPU per call of the client alone (a script): ``LLMClient.complete`` against the stub in its own process, distinct
prompts (each a miss of the response cache, written to it), C calls in flight, after a warm-up; the process's
CPU (every thread: the cache's writes included) over the calls. Issue 43 asks for each call to cost less CPU; a
whole job's figure (``cpu_profile.py``, ``versus_official.py``) moves by more than a client-side cut between runs.

Each checkout given runs this script in its own process (that checkout's code on the path), the checkouts
interleaved, ``--rounds`` each:

    python bench/client_cpu.py                       # this checkout
    python bench/client_cpu.py /tmp/before .         # another checkout against this one, interleaved
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def one(calls: int, concurrency: int, cache: bool, latency_ms: int) -> dict[str, float]:
    """This process's CPU per call, in ms (the code on its path), its wall time and the stub's mean in flight."""
    from bench import Stub
    from cupid_exp.config import CallsConfig, ModelConfig
    from cupid_exp.llm.client import LLMClient, configure_litellm
    from cupid_exp.llm.usage import UsageMeter

    with Stub(latency_ms=latency_ms) as stub, tempfile.TemporaryDirectory() as tmp:
        settings = CallsConfig(cache_dir=f"{tmp}/cache", cache=cache, num_retries=0, timeout=30)
        configure_litellm(settings)
        model = ModelConfig(name="m", litellm_model="openai/gpt-4o-2024-08-06", api_base=stub.url,
                            params={"max_tokens": 50}, max_concurrency=concurrency)
        client = LLMClient(model, settings, UsageMeter())

        async def run(tag: str, n: int) -> None:
            async def call(i: int) -> None:
                await client.complete([{"role": "user", "content": f"{tag} prompt {i}: say hello."}], step="s")

            slots = asyncio.Semaphore(concurrency)

            async def bounded(i: int) -> None:
                async with slots:
                    await call(i)

            await asyncio.gather(*(bounded(i) for i in range(n)))

        async def measure() -> dict[str, float]:
            await run("warm-up", 2 * concurrency)
            stub.reset()
            cpu, wall = time.process_time(), time.perf_counter()
            await run(f"run {time.time_ns()}", calls)
            return {"cpu_ms": 1000 * (time.process_time() - cpu) / calls, "wall_s": time.perf_counter() - wall,
                    "in_flight": stub.stats()["mean_in_flight"]}

        return asyncio.run(measure())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkouts", nargs="*", type=Path, default=[BENCH.parent])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-cache", action="store_true", help="calls.cache=false")
    p.add_argument("--latency-ms", type=int, default=0, help="the stub's time to answer a request")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one measurement, as JSON
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.calls, args.concurrency, not args.no_cache, args.latency_ms)))
        return
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    runs: dict[Path, list[dict[str, float]]] = {c.resolve(): [] for c in args.checkouts}
    for _ in range(args.rounds):
        for checkout in runs:
            out = subprocess.run(
                [sys.executable, __file__, "--one", "--calls", str(args.calls),
                 "--concurrency", str(args.concurrency), "--latency-ms", str(args.latency_ms),
                 *(["--no-cache"] if args.no_cache else [])],
                cwd=checkout, env={**env, "PYTHONPATH": str(checkout)}, capture_output=True, text=True, check=True)
            runs[checkout].append(json.loads(out.stdout.splitlines()[-1]))
    load = os.getloadavg()
    print(f"`python bench/client_cpu.py {' '.join(sys.argv[1:])}` on {time.strftime('%Y-%m-%d %H:%M')}: "
          f"{args.calls} calls, concurrency {args.concurrency}, replies after {args.latency_ms} ms, response cache "
          f"{'off' if args.no_cache else 'on'}; "
          f"{os.cpu_count()} cores; load average at the end {load[0]:.1f}\n")
    print(f"| checkout | CPU per call, ms | wall, s | mean in flight (of {args.concurrency}) |\n|---|---|---|---|")
    for checkout, measured in runs.items():
        cells = []
        for name, form in (("cpu_ms", ".2f"), ("wall_s", ".1f"), ("in_flight", ".1f")):
            values = [m[name] for m in measured]
            cells.append(f"{statistics.median(values):{form}} ({', '.join(f'{v:{form}}' for v in values)})")
        print(f"| {checkout} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
