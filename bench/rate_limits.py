#!/usr/bin/env python
"""cupid-exp (and the official runner, when a checkout is given) against a key with OpenAI's limits (a script).

The stub server (``cupid_exp/testing/stub_llm_server.py --rpm/--tpm``, limits in ``cupid_exp/testing/rate_limits.py``)
enforces requests per minute or tokens per minute in one-second windows, answers 429 with OpenAI's headers
and body, and counts prompt + ``max_tokens`` toward TPM. A fresh stub per run, so every run meets a closed
window at the start. Reported per row (median and range over ``--repeats`` rounds; each round runs every row
once, in turn, so that the machine's load meets them alike): instances completed, wall time against the limit's
ideal (the sum of each admitted request's share of the binding limit, from the stub), requests and the share
answered 429. The provider's pools (``--limits-pool``):

* ``model`` (the default): each model its own limit; cupid-exp's roles then name a pool per model
  (``model.pool.name=subject``, the evaluator roles ``pool.name=evaluator``): issue 36's "separate pools";
* ``key``: one pool for both snapshots (OpenAI's gpt-4o family, a proxy); cupid-exp's default grouping (one pool
  per ``api_base``) matches it, and "limits set" gives the pool's ``rpm``/``tpm`` once (``calls.pools``).

``--limit-headers retry-after``: the stub's 429s state nothing but ``retry-after`` in whole seconds.
``--bucket continuous``: the stub's limits a bucket of one second's share refilled continuously (full at the
start), instead of one-second windows.
``--rate-429 0.1``: an overloaded provider besides (or instead of) the limit: that share of requests answered 429
at random (seeded by the prompt and the attempt) with ``retry-after: --retry-after``; each cupid-exp row is then
run without it and with it, in turn, so that the throughput lost to the refusals reads off the pair.
``--task synthesis``: ``python -m cupid_exp.synthesize`` (``--personas``) instead of an inference job.
``--compare DIR``: the same rows (adaptation alone, limits set on every role) from another checkout of
cupid-exp (the code before a change), interleaved with these.

Rows: cupid-exp with adaptation alone; with the limits set; ``--parallel N``: N jobs started together on the
same key (one process each, one ``calls.cache_dir`` for their ledger), with the limits set and without, and
the same N jobs as one ``-m`` sweep under Hydra's joblib launcher; the official runner (``--official DIR
--official-python PY``; inference only).

    python bench/rate_limits.py --instances 30 --rpm 300 --limits-pool key --repeats 3 --parallel 0
    python bench/rate_limits.py --task synthesis --rpm 480 --limit-headers retry-after --repeats 3
    python bench/rate_limits.py --task synthesis --rate-429 0.1 --retry-after 2 --parallel 0   # no limit, overloaded
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from versus_official import OFFICIAL_MODELS, official_instances, ours_command

from bench import ENV, Stub, emit, machine
from cupid_exp.llm.pools import pool_name
from cupid_exp.testing.cupid_data import write_dataset

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

ROLES = ("model", "evaluator.decomposer", "evaluator.matcher", "evaluator.judge")
SYNTHESIS_ROLES = ("persona_writer", "factor_writer", "session_writer", "user_simulator", "assistant_simulator",
                   "decomposer", "validator")


def limits(args: argparse.Namespace) -> dict[str, float]:
    return {k: v for k, v in (("rpm", args.rpm), ("tpm", args.tpm)) if v}


def role_names(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(f"synthesis.roles.{r}" for r in SYNTHESIS_ROLES) if args.task == "synthesis" else ROLES


def limit_overrides(args: argparse.Namespace, url: str, before: bool) -> list[str]:
    """The key's limits: once for the pool where the provider has one pool (and the code knows pools), else on
    every role."""
    if args.limits_pool == "key" and not before:
        pool = pool_name("openai/stub", url)
        return [f"+calls.pools.{pool}.{k}={v:g}" for k, v in limits(args).items()]
    return [f"{role}.pool.{k}={v:g}" for role in role_names(args) for k, v in limits(args).items()]


def pool_overrides(args: argparse.Namespace, before: bool) -> list[str]:
    """Separate pools where the provider has them: the subject's and the evaluator's (the code before knew no
    pools: it kept every config apart)."""
    if args.limits_pool != "model" or before or args.task == "synthesis":
        return []
    return ["model.pool.name=subject", *(f"{role}.pool.name=evaluator" for role in ROLES[1:])]


def job_files(root: Path, name: str) -> list[Path]:
    """A job's ``name`` files under a single run's folder (runs/, synthesis/) or a sweep's (multirun/)."""
    return [f for folder in ("runs", "multirun", "synthesis") for f in root.glob(f"{folder}/**/{name}")]


def synthesis_command(args: argparse.Namespace, url: str, root: Path) -> list[str]:
    cmd = [sys.executable, "-m", "cupid_exp.synthesize", f"paths.output_root={root}", "runtime.progress=false",
           f"synthesis.n_personas={args.personas}", "synthesis.max_turns=2"]
    for role in SYNTHESIS_ROLES:
        cmd += [f"llm@synthesis.roles.{role}=openai_compatible", f"synthesis.roles.{role}.litellm_model=openai/stub",
                f"synthesis.roles.{role}.api_base={url}", f"synthesis.roles.{role}.structured_output=true",
                f"synthesis.roles.{role}.max_concurrency={args.concurrency}"]
    return cmd


def ours(args: argparse.Namespace, url: str, data: Path, work: Path, extra: list[str], jobs: int = 1,
         joblib: bool = False, tree: Path = ROOT) -> dict[str, Any]:
    """``jobs`` cupid-exp processes (of the checkout ``tree``) started together, one ``calls.cache_dir`` (their
    pacing ledger), no response cache (every job makes every call, as jobs on different models would);
    ``joblib``: instead one ``-m`` sweep of ``jobs`` jobs run side by side by Hydra's joblib launcher."""
    roots = [work / f"ours-{time.monotonic_ns()}-{i}" for i in range(1 if joblib else jobs)]
    cache = work / f"cache-{time.monotonic_ns()}"
    procs = []
    start = time.perf_counter()
    for i, root in enumerate(roots):
        if args.task == "synthesis":
            cmd = synthesis_command(args, url, root) + [f"synthesis.seed={i}"]
        else:
            temperature = (f"model.params.temperature={','.join(f'{j / 10:g}' for j in range(jobs))}" if joblib
                           else f"model.params.temperature={i / 10:g}")
            cmd = ours_command(url, root, data, args.concurrency) + [temperature]
            if joblib:  # Hydra's --multirun flag before the overrides
                cmd[3:3] = ["-m", "hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]
        cmd += ["tracking=none", f"calls.cache_dir={cache}", "calls.cache=false", *extra]
        env = {**ENV, "OPENAI_API_KEY": "sk-bench", "PYTHONPATH": str(tree)}
        procs.append(subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outputs = [p.communicate(timeout=args.limit_s)[0] for p in procs]
    wall = time.perf_counter() - start
    done = total = 0
    model_s = 0.0
    for root, out, proc in zip(roots, outputs, procs, strict=False):
        if proc.returncode not in (0, 3):
            print(out[-2000:])
        metrics = [json.loads(f.read_text())["metrics"] for f in job_files(root, "metrics.json")]
        if args.task == "synthesis":
            done += sum(int(m.get("personas/completed", 0)) for m in metrics)
            total += args.personas
            phases = [m.get("time/seconds", 0.0) for m in metrics]
        else:
            records = [json.loads(x) for f in job_files(root, "instances.jsonl") for x in f.read_text().splitlines()]
            done += sum(1 for r in records if not r["errors"])
            total += args.instances * (jobs if joblib else 1)
            phases = [m.get("time/model_seconds", 0.0) for m in metrics]
        model_s = max([model_s, *phases])
    return {"wall": wall, "done": done, "total": total, "codes": [p.returncode for p in procs], "model_s": model_s}


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
    return {"wall": wall, "done": done, "total": args.instances, "codes": [proc.returncode], "model_s": None}


def measured(run: dict[str, Any], stub: Stub) -> dict[str, Any]:
    st = stub.stats()
    run.update(requests=st["total_received"], limited=st["rate_limited"], ideal=st["limits_ideal_s"])
    return run


def rows(args: argparse.Namespace, data: Path, work: Path, has_official: bool
         ) -> list[tuple[str, Callable[[str], dict[str, Any]]]]:
    """The runs of one round: (name, run at the stub's url)."""
    def run(before: bool, limited: bool, **kw: Any) -> Callable[[str], dict[str, Any]]:
        tree = args.compare if before else ROOT
        return lambda url: ours(args, url, data, work, pool_overrides(args, before) + (
            limit_overrides(args, url, before) if limited else []), tree=tree, **kw)

    set_how = "the pool's limits given once" if args.limits_pool == "key" else "rpm/tpm set"
    out = [("cupid-exp, adaptation alone", run(False, False))]
    if limits(args):
        out.append((f"cupid-exp, {set_how}", run(False, True)))
    if args.compare is not None:
        out += [("before, adaptation alone", run(True, False)), ("before, rpm/tpm set on every role", run(True, True))]
    if args.parallel and args.task == "inference":
        n = args.parallel
        out += [(f"cupid-exp, {n} jobs in parallel, {set_how}", run(False, True, jobs=n)),
                (f"cupid-exp, {n} jobs in parallel, adaptation alone", run(False, False, jobs=n)),
                (f"cupid-exp, a joblib sweep of {n} jobs, {set_how}", run(False, True, jobs=n, joblib=True))]
    if has_official and args.task == "inference":
        data_dir = official_instances(data, work / "official-data")
        out.insert(0, ("official runner", lambda url: official(args, url, data_dir, work)))
    if args.rate_429:  # each row without the overload, then with it
        refused = f", {100 * args.rate_429:g}% answered 429 at random (retry-after {args.retry_after:g} s)"
        out = [row for name, go in out for row in ((name, go), (name + refused, go))]
    return out


def stub_faults(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """The stub's random 429s, for the rows that name them."""
    return {"rate_429": args.rate_429, "retry_after": args.retry_after} if "at random" in name else {}


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    values = sorted(values)
    mid = fmt.format(statistics.median(values))
    return mid if len(values) == 1 else f"{mid} ({fmt.format(values[0])}–{fmt.format(values[-1])})"


def table(name: str, runs: list[dict[str, Any]]) -> str:
    done, total = sum(r["done"] for r in runs), sum(r["total"] for r in runs)
    requests, limited = sum(r["requests"] for r in runs), sum(r["limited"] for r in runs)
    ideal = statistics.median(r["ideal"] for r in runs)
    phases = [r["model_s"] for r in runs if r["model_s"]]
    phase = spread(phases) if phases else "–"
    ratio = (f"{statistics.median(p / r['ideal'] for p, r in zip(phases, runs, strict=False)):.2f} "
             if phases and ideal else "")
    ratio += f"({statistics.median(r['wall'] / r['ideal'] for r in runs):.2f})" if ideal else "–"
    return (f"| {name} | {done}/{total} ({100 * done / max(1, total):.0f}%) | {spread([r['wall'] for r in runs])} | "
            f"{phase} | {ideal:.1f} | {ratio} | {requests / len(runs):.0f} | {limited / len(runs):.0f} "
            f"({100 * limited / max(1, requests):.1f}%) |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, default=30)
    p.add_argument("--task", choices=("inference", "synthesis"), default="inference")
    p.add_argument("--personas", type=int, default=4, help="--task synthesis: personas per job")
    p.add_argument("--latency", type=float, default=0.2)
    p.add_argument("--jitter", type=float, default=0.0, help="seconds of uniform extra latency (0.4: 0.3-0.7 s)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rpm", type=float, default=0.0)
    p.add_argument("--tpm", type=float, default=0.0)
    p.add_argument("--limits-pool", choices=("model", "key"), default="model",
                   help="the stub's pools: one per model, or one for the key (both snapshots together)")
    p.add_argument("--limit-headers", choices=("openai", "retry-after"), default="openai",
                   help="what the stub's 429s state: OpenAI's headers and body, or only retry-after in seconds")
    p.add_argument("--bucket", choices=("windows", "continuous"), default="windows",
                   help="how the stub spends a per-minute limit: one-second windows, or a bucket of one second's "
                        "share refilled continuously")
    p.add_argument("--rate-429", type=float, default=0.0,
                   help="besides: this share of requests answered 429 at random (an overloaded provider)")
    p.add_argument("--retry-after", type=float, default=2.0, help="--rate-429: the wait those 429s ask, seconds")
    p.add_argument("--parallel", type=int, default=4, help="N jobs side by side on one key (0: skip)")
    p.add_argument("--repeats", type=int, default=1, help="rounds of every row, interleaved")
    p.add_argument("--compare", type=Path, default=None, help="another checkout of cupid-exp: its rows beside these")
    p.add_argument("--official", type=Path, default=os.environ.get("CUPID_OFFICIAL_DIR"))
    p.add_argument("--official-python", default=sys.executable)
    p.add_argument("--limit-s", type=float, default=900.0)
    p.add_argument("--out", type=Path, default=None, help="append the table to this markdown file")
    args = p.parse_args()
    if not (args.rpm or args.tpm or args.rate_429):
        p.error("give --rpm and/or --tpm (or --rate-429)")
    has_official = args.official is not None and (Path(args.official) / "evaluation" / "run.py").is_file()
    work = Path(tempfile.mkdtemp(prefix="cupid-limits-"))
    results: dict[str, list[dict[str, Any]]] = {}
    stub_opts = dict(latency_ms=int(args.latency * 1000), jitter_ms=int(args.jitter * 1000),
                     model_ids=",".join(OFFICIAL_MODELS), rpm=args.rpm, tpm=args.tpm, limits_pool=args.limits_pool,
                     limit_headers=args.limit_headers, bucket=args.bucket)
    started = time.strftime("%Y-%m-%d %H:%M")
    try:
        data = write_dataset(work / "data.jsonl", args.instances)
        for round_ in range(args.repeats):
            for name, run in rows(args, data, work, has_official):
                with Stub(**stub_opts, **stub_faults(args, name)) as stub:
                    r = measured(run(stub.url), stub)
                results.setdefault(name, []).append(r)
                print(f"#{round_ + 1} {name}: {r['done']}/{r['total']} done, {r['wall']:.1f} s, model phase "
                      f"{r['model_s']} s (ideal {r['ideal']:.1f} s), {r['limited']}/{r['requests']} answered 429, "
                      f"exit {r['codes']}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    m, load = machine(), os.getloadavg()
    limit = " and ".join(f"{v:g} {k.upper()}" for k, v in limits(args).items()) or "no limit"
    flags = " ".join(sys.argv[1:])
    what = (f"synthesis, {args.personas} personas a job" if args.task == "synthesis" else
            f"{args.instances} instances, task=inference, model=gpt4o evaluator=gpt4o")
    spread_ms = f"–{(args.latency + args.jitter) * 1000:.0f}" if args.jitter else ""
    lines = ["", f"## {what} at {limit} ({'one pool for the key' if args.limits_pool == 'key' else 'a pool per model'}"
             f"{', 429s with retry-after only' if args.limit_headers == 'retry-after' else ''}"
             f"{', a bucket refilled continuously' if args.bucket == 'continuous' else ''})", "",
             f"`python bench/rate_limits.py {flags}` from {started} to {time.strftime('%H:%M')}: stub latency "
             f"{args.latency * 1000:.0f}{spread_ms} ms, concurrency {args.concurrency}, {args.repeats} interleaved "
             f"round(s), median (min–max); {m['nproc']} cores, {m['cpu']}, Python {m['python']}, litellm "
             f"{m['litellm']}; load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}. Ideal: the sum "
             "of each admitted request's share of the binding limit (the stub's count); model phase: "
             "`time/model_seconds` (synthesis: `time/seconds`), the largest of a row's jobs.", "",
             "| run | completed | wall, s | model phase, s | ideal, s | model phase (wall) / ideal | requests "
             "| answered 429 |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [table(name, runs) for name, runs in results.items()]
    for name, runs in results.items():  # --rate-429: the throughput kept, per pair of rows (by the model phase)
        plain = results.get(name.split(", " + f"{100 * args.rate_429:g}% answered")[0])
        if "at random" in name and plain and all(r["model_s"] for r in runs + plain):
            kept = statistics.median(r["model_s"] for r in plain) / statistics.median(r["model_s"] for r in runs)
            lines.append(f"\n{name}: {100 * kept:.0f}% of the throughput without the refusals (model phase).")
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
