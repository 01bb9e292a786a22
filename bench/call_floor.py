#!/usr/bin/env python
"""What the call layer alone costs (a script): issue 43's requests, each kind of client in a process of its own,
counted whole (its imports included), against the stub in another process. It answers one question: how much of a
job's CPU per request is the call layer's floor, before anything of ours (the cache, journal, traces, scoring)?

    openai    the OpenAI SDK's async client alone (the official runner's path, less its threads)
    litellm   ``litellm.acompletion`` alone: no cache, no callbacks, the provider named (as our client calls it)
    client    our ``LLMClient.complete`` with the response cache on (the job's default), no MLflow

Each kind runs ``--rounds`` times, interleaved:

    python bench/call_floor.py --calls 3024 --concurrency 64 --latency-ms 500 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
KINDS = ("openai", "litellm", "client")
MODEL = "gpt-4o-2024-08-06"
PROMPT = "Earlier sessions of this user, one per line. " * 120  # ~5 KB, the order of an inference prompt


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one(kind: str, url: str, calls: int, concurrency: int) -> dict[str, float]:
    """This process's CPU: its imports and set-up, then per call (every thread), in one run of ``calls``."""
    started = _cpu()
    if kind == "openai":
        import openai

        sdk = openai.AsyncOpenAI(base_url=url, api_key="fake", max_retries=0)

        async def send(text: str) -> None:
            await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=50)
    elif kind == "litellm":
        import litellm

        async def send(text: str) -> None:
            await litellm.acompletion(model=f"openai/{MODEL}", api_base=url, api_key="fake", max_tokens=50,
                                      messages=[{"role": "user", "content": text}], custom_llm_provider="openai",
                                      num_retries=0)
    else:
        from cupid_exp.config import CallsConfig, ModelConfig
        from cupid_exp.llm.client import LLMClient, configure_litellm
        from cupid_exp.llm.usage import UsageMeter

        settings = CallsConfig(cache_dir=f"{tempfile.mkdtemp()}/cache", cache=True, num_retries=0, timeout=30)
        configure_litellm(settings)
        client = LLMClient(ModelConfig(name="m", litellm_model=f"openai/{MODEL}", api_base=url,
                                       params={"max_tokens": 50}, max_concurrency=concurrency), settings, UsageMeter())

        async def send(text: str) -> None:
            await client.complete([{"role": "user", "content": text}], step="s")

    set_up = _cpu() - started

    async def run() -> float:
        slots = asyncio.Semaphore(concurrency)

        async def bounded(i: int) -> None:
            async with slots:
                await send(f"{PROMPT} request {i} of run {time.time_ns()}")

        await bounded(-1)  # the first call's own set-up (connection, lazy imports): in the whole process only
        cpu = _cpu()
        await asyncio.gather(*(bounded(i) for i in range(calls)))
        return _cpu() - cpu

    return {"set_up_s": set_up, "per_call_ms": 1000 * asyncio.run(run()) / calls}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=3024)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--latency-ms", type=int, default=500)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--one", nargs=2, metavar=("KIND", "URL"), help=argparse.SUPPRESS)  # a child: one run, as JSON
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], args.calls, args.concurrency)))
        return
    from bench import Stub

    kinds = args.kinds.split(",")
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(BENCH.parent)}
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    with Stub(latency_ms=args.latency_ms) as stub:
        for _ in range(args.rounds):
            for kind in kinds:
                out = subprocess.run(
                    ["/usr/bin/time", "-f", "%U %S", sys.executable, __file__, "--one", kind, stub.url,
                     "--calls", str(args.calls), "--concurrency", str(args.concurrency)],
                    cwd=BENCH.parent, env=env, capture_output=True, text=True, check=True)
                measured = json.loads(out.stdout.splitlines()[-1])
                user, system = map(float, out.stderr.split()[-2:])
                measured["process_s"] = user + system  # the whole process, interpreter start to exit
                measured["process_ms_per_call"] = 1000 * measured["process_s"] / args.calls
                runs[kind].append(measured)
    load = os.getloadavg()
    print(f"`python bench/call_floor.py {' '.join(sys.argv[1:])}` on {time.strftime('%Y-%m-%d %H:%M')}: "
          f"{args.calls} calls, {args.concurrency} in flight, replies after {args.latency_ms} ms; "
          f"{os.cpu_count()} cores; load average at the end {load[0]:.1f}; median (runs)\n")
    columns = (("set_up_s", "imports and set-up, CPU s", ".2f"), ("per_call_ms", "CPU per call, ms", ".2f"),
               ("process_s", "whole process, CPU s", ".1f"), ("process_ms_per_call", "whole process per call, ms",
                                                                ".2f"))
    print("| kind | " + " | ".join(title for _, title, _ in columns) + " |\n" + "|---" * (len(columns) + 1) + "|")
    for kind, measured in runs.items():
        cells = []
        for name, _, form in columns:
            values = [m[name] for m in measured]
            cells.append(f"{statistics.median(values):{form}} ({', '.join(f'{v:{form}}' for v in values)})")
        print(f"| {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
