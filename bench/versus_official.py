#!/usr/bin/env python
"""cupid-exp and the official runner (kixlab/CUPID) side by side on the same work (a script, not a test).

Both answer to the same stub OpenAI-compatible server on 127.0.0.1 (``cupid_exp/testing/stub_llm_server.py``,
a fixed latency per request), on the same synthetic instances in the real CUPID schema, on the same
machine, interleaved run by run so that the machine's load hits both alike:

* official: ``python -m evaluation.run --model gpt-4.1-nano-2025-04-14 --n_workers C --task inference --data_dir …``
  from a checkout of kixlab/CUPID (``--official DIR``; skipped when absent), run by ``--official-python``
  (a Python with its requirements: openai, anthropic, google-genai, datasets, python-dotenv, tiktoken);
* cupid-exp: ``python -m cupid_exp model=gpt4o evaluator=gpt4o task=inference`` with every model's
  ``api_base`` on the stub and ``max_concurrency`` C, a fresh output folder and response cache per run,
  MLflow tracking into a SQLite store that already exists (as it does from a user's second run on; the
  first-run store creation is reported apart). Every role calls one provider pool (one ``api_base``), so at
  most C requests are in flight over all roles, as the official runner's C workers send them
  (``--per-role-pools``: each role its own pool, up to 3 C, as before pools; ``--compare DIR``: the code
  before, with its per-config bounds and held to C over all roles by a split per role).

Reported per run: whole-process wall time, CPU seconds and CPU per request served, requests the stub served,
the most requests it had in flight at once and how many on average (from its first arrival to its last answer:
issue 43 asks for 58 of 64), cupid-exp's event-loop lag (``loop_lag/sitecustomize.py``: worst and 99th percentile
wake-up delay of a 10 ms sleep, the stalls over 100 ms and which a full GC overlapped), peak RSS (the largest single
process, as ``/usr/bin/time`` reports it, and the whole process tree summed, sampled every 20 ms), and
for cupid-exp its model phase (``time/model_seconds``) against the ideal requests × latency /
concurrency, and its fixed cost (wall − model phase). The report is printed, and appended to ``--out`` when given
(``bench/versus_official.md`` is a log of dated sections with their reading: a report goes in by hand, with it).

    python bench/versus_official.py --official /path/to/CUPID --official-python /path/to/venv/bin/python
    python bench/versus_official.py ... --close-connections   # the stub as an HTTP/1.0 server (no keep-alive)
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
import threading
import time
from pathlib import Path
from typing import Any

from bench import ENV, Stub, emit, machine
from cupid_exp.testing.cupid_data import write_dataset

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

# the official runner checks that its models are listed by the server
OFFICIAL_MODELS = ("gpt-4.1-nano-2025-04-14", "gpt-4o-2024-11-20")


class TreeMemory:
    """Samples the summed RSS of a process and its descendants (from /proc) until stopped; also each process's
    own peak (``peak_by_pid``: the job's process is ``pid``)."""

    def __init__(self, pid: int, every_s: float = 0.02):
        self.pid, self.every_s, self.peak_kb = pid, every_s, 0
        self.peak_by_pid: dict[int, int] = {}
        self.page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree_rss_kb(self) -> int:
        """The tree's summed RSS, walked from ``pid`` through each thread's ``children`` file: reading every
        process's stat under /proc every 20 ms took ~12% of a core, which the job under test paid for."""
        total, todo = 0, [self.pid]
        while todo:
            pid = todo.pop()
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                kb = int(stat[stat.rindex(")") + 2:].split()[21]) * self.page_kb
                for task in os.listdir(f"/proc/{pid}/task"):
                    todo += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
            except (OSError, ValueError, IndexError):
                continue
            total += kb
            self.peak_by_pid[pid] = max(self.peak_by_pid.get(pid, 0), kb)
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kb = max(self.peak_kb, self._tree_rss_kb())
            self._stop.wait(self.every_s)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak_kb


class Hung(RuntimeError):
    """A run that went past its time limit (it was killed)."""


def timed(cmd: list[str], cwd: Path, env: dict[str, str], limit_s: float | None = None) -> dict[str, Any]:
    """Run ``cmd``; wall time, CPU seconds, the largest process's peak RSS and the tree's summed peak.
    Past ``limit_s`` the process group is killed and ``Hung`` raised."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    killer = threading.Timer(limit_s, lambda: os.killpg(proc.pid, 9)) if limit_s else None
    if killer is not None:
        killer.start()
    tree = TreeMemory(proc.pid)
    out_chunks: list[str] = []
    reader = threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True)
    reader.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if killer is not None:
        killer.cancel()
        if limit_s and wall >= limit_s:
            tree.stop()
            raise Hung(f"{cmd[:4]} killed after {wall:.0f} s")
    proc.returncode = os.waitstatus_to_exitcode(status)
    reader.join()
    output = "".join(out_chunks)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}):\n{output[-3000:]}")
    tree_kb = tree.stop()
    others = sorted((kb for pid, kb in tree.peak_by_pid.items() if pid != proc.pid), reverse=True)
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss_max_mb": usage.ru_maxrss / 1024,
            "rss_tree_mb": tree_kb / 1024, "rss_main_mb": tree.peak_by_pid.get(proc.pid, 0) / 1024,
            "rss_child_mb": (others[0] if others else 0) / 1024, "output": output}


def official_instances(rows: Path, folder: Path) -> Path:
    """The official runner's --data_dir layout: one JSON file per instance, named by its persona id."""
    folder.mkdir(parents=True, exist_ok=True)
    for line in rows.read_text().splitlines():
        row = json.loads(line)
        name = f"{row['persona_id']}-{row['instance_type']}".replace("/", "_")
        (folder / f"{name}.json").write_text(json.dumps({k: row[k] for k in (
            "current_request", "current_contextual_preference", "current_checklist", "prior_interactions")}))
    return folder


def run_official(args: argparse.Namespace, stub: Stub, data_dir: Path, work: Path) -> dict[str, Any]:
    results = work / "official-results"
    shutil.rmtree(results, ignore_errors=True)
    env = {**ENV, "OPENAI_API_KEY": "sk-bench", "OPENAI_BASE_URL": stub.url, "PYTHONPATH": str(args.official)}
    stub.reset()
    res = timed([args.official_python, "-m", "evaluation.run", "--results_dir", str(results),
                 "--model", OFFICIAL_MODELS[0],
                 "--data_dir", str(data_dir), "--n_workers", str(args.concurrency), "--task", "inference",
                 "--log_file", str(work / "official.log")], cwd=args.official, env=env, limit_s=args.official_limit)
    served = stub.stats()  # since the reset: this run's alone
    res["requests"], res["peak_in_flight"] = served["total_completed"], served["peak_in_flight"]
    res["mean_in_flight"] = served["mean_in_flight"]
    summary = json.loads((results / OFFICIAL_MODELS[0] / "results.json").read_text())["inference"]
    res["micro_f1"] = 100 * summary["f1"]
    return res


def ours_command(url: str, root: Path, data: Path, concurrency: int) -> list[str]:
    cmd = [sys.executable, "-m", "cupid_exp", "model=gpt4o", "evaluator=gpt4o", "task=inference", "data=local",
           f"data.path={data}", f"paths.output_root={root}", f"calls.cache_dir={root / 'cache'}",
           "runtime.progress=false", f"model.api_base={url}", f"model.max_concurrency={concurrency}"]
    for role in ("decomposer", "matcher", "judge"):
        cmd += [f"evaluator.{role}.api_base={url}", f"evaluator.{role}.max_concurrency={concurrency}"]
    return cmd


def run_ours(args: argparse.Namespace, stub: Stub, data: Path, work: Path, store: Path | None,
             *extra: str, tree: Path = ROOT) -> dict[str, Any]:
    """One cupid-exp run of the checkout ``tree`` (this one, or ``--compare``'s)."""
    root = work / f"ours-{time.monotonic_ns()}"
    root.mkdir()
    if store is not None:  # an existing, migrated MLflow store, as from a user's earlier runs
        shutil.copyfile(store, root / "mlflow.db")
    lag = root / "loop-lag"
    lag.mkdir()
    env = {**ENV, "OPENAI_API_KEY": "sk-bench", "PYTHONPATH": f"{BENCH / 'loop_lag'}{os.pathsep}{tree}",
           "CUPID_BENCH_LOOP_LAG": str(lag)}
    stub.reset()
    res = timed(ours_command(stub.url, root, data, args.concurrency) + list(extra), cwd=tree, env=env)
    served = stub.stats()  # since the reset: this run's alone
    res["requests"], res["peak_in_flight"] = served["total_completed"], served["peak_in_flight"]
    res["mean_in_flight"] = served["mean_in_flight"]
    res.update(loop_lag(lag))
    (metrics_file,) = root.glob("runs/**/metrics.json")
    metrics = json.loads(metrics_file.read_text())["metrics"]
    res["model_s"] = metrics["time/model_seconds"]
    res["micro_f1"] = 100 * metrics["inference/micro/f1"]
    res["ideal_s"] = res["requests"] * args.latency / args.concurrency
    shutil.rmtree(root, ignore_errors=True)
    return res


def loop_lag(folder: Path) -> dict[str, Any]:
    """The event loop's lag in the run's longest ``asyncio.run`` (``loop_lag/sitecustomize.py``: the job's model phase;
    a calls worker's with ``runtime.workers``): its worst and 99th percentile wake-up delay, its stalls over 100 ms,
    and the collections of the GC's oldest generation."""
    runs = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    if not runs:
        return {"lag_max_s": float("nan"), "lag_p99_s": float("nan"), "stalls": [], "gen2": []}
    run = max(runs, key=lambda r: r["seconds"])
    return {"lag_max_s": run["max_s"], "lag_p99_s": run["p99_s"], "stalls": run["stalls_over_100ms"],
            "gen2": run["gen2_collections"]}


def gc_stalls(run: dict[str, Any]) -> int:
    """Stalls of the loop that a full collection overlapped (it began between the sleep's start and its late
    wake-up)."""
    return sum(any(at <= start <= at + 0.01 + lag for start, _ in run["gen2"]) for at, lag in run["stalls"])


def per_role_pools() -> list[str]:
    """Each role its own pool (what every config had before pools): up to 3 x --concurrency in flight."""
    return ["model.pool.name=subject",
            *(f"evaluator.{role}.pool.name={role}" for role in ("decomposer", "matcher", "judge"))]


def equal_in_flight(concurrency: int) -> list[str]:
    """For the code before pools (``--compare``): overrides that bound its requests in flight, all roles together,
    by the official runner's ``--n_workers``: there ``max_concurrency`` bounded each model config (subject 64,
    evaluator 64: up to 192 at once), while the official runner's workers each send one request at a time. Split
    as the calls are: per instance one subject call, one decomposition, two matches."""
    quarter, half = max(1, concurrency // 4), max(1, concurrency // 2)
    return [f"model.max_concurrency={quarter}", f"evaluator.decomposer.max_concurrency={quarter}",
            f"evaluator.matcher.max_concurrency={half}", f"evaluator.judge.max_concurrency={half}"]


def run_official_series(args: argparse.Namespace, stub: Stub, data_dir: Path, work: Path) -> dict[str, Any]:
    """The official runner once per model, one after the other (it has no sweeps): wall and requests summed."""
    runs = [run_official(args, stub, data_dir, work) for _ in range(args.sweep)]
    return {"wall": sum(r["wall"] for r in runs), "requests": sum(r["requests"] for r in runs)}


def run_ours_sweep(args: argparse.Namespace, stub: Stub, data: Path, work: Path, store: Path) -> dict[str, Any]:
    """One cupid-exp multirun of ``--sweep`` jobs that differ in the model's temperature (no job resumes another),
    without the response cache (the stub's replies do not depend on the temperature: the evaluator's calls would be
    hits), so that every job makes every call: wall, requests, and the sum of the jobs' model phases."""
    root = work / f"sweep-{time.monotonic_ns()}"
    root.mkdir()
    shutil.copyfile(store, root / "mlflow.db")
    temperatures = ",".join(f"{i / 10:g}" for i in range(args.sweep))
    cmd = ours_command(stub.url, root, data, args.concurrency)
    cmd = [*cmd[:3], "-m", *cmd[3:], f"model.params.temperature={temperatures}", "calls.cache=false"]
    before = stub.stats()["total_completed"]
    res = timed(cmd, cwd=ROOT, env={**ENV, "OPENAI_API_KEY": "sk-bench"})
    res["requests"] = stub.stats()["total_completed"] - before
    phases = [json.loads(f.read_text())["metrics"]["time/model_seconds"] for f in root.glob("runs/**/metrics.json")]
    if len(phases) != args.sweep:
        raise RuntimeError(f"the sweep wrote {len(phases)} jobs' metrics, not {args.sweep}")
    res["model_s"] = sum(phases)
    shutil.rmtree(root, ignore_errors=True)
    return res


def migrated_store(work: Path) -> Path:
    """An empty MLflow SQLite store with its schema migrations done (what a second run finds)."""
    from mlflow.tracking import MlflowClient

    path = work / "template" / "mlflow.db"
    path.parent.mkdir(parents=True)
    MlflowClient(f"sqlite:///{path}").search_experiments(max_results=1)
    return path


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    values = sorted(values)
    mid = statistics.median(values)
    return fmt.format(mid) + (f" ({fmt.format(values[0])}–{fmt.format(values[-1])})" if len(values) > 1 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--official", type=Path, default=os.environ.get("CUPID_OFFICIAL_DIR"),
                        help="a checkout of kixlab/CUPID (default $CUPID_OFFICIAL_DIR); without it only cupid-exp runs")
    parser.add_argument("--official-python", default=sys.executable)
    parser.add_argument("--instances", type=int, default=30)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per request at the stub")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--official-limit", type=float, default=60.0,
                        help="seconds after which an official run counts as hung: killed, left out, and counted")
    parser.add_argument("--out", type=Path, default=None,
                        help="also append the report to this file (created if absent); what it holds is kept")
    parser.add_argument("--sweep", type=int, default=0, metavar="N",
                        help="also N models one after the other: the official runner N times, cupid-exp as one "
                             "multirun of N jobs (in one process, as a researcher's `-m` sweep)")
    parser.add_argument("--per-role-pools", action="store_true",
                        help="also run cupid-exp with each role its own pool (up to 3 x --concurrency in flight)")
    parser.add_argument("--compare", type=Path, default=None, metavar="DIR",
                        help="also run another checkout of cupid-exp (the code before pools), at its defaults and held "
                             "to --concurrency in flight over all roles (equal_in_flight), interleaved")
    parser.add_argument("--tracking-costs", action="store_true",
                        help="also run cupid-exp with tracking.traces=false and with tracking=none: what tracing and "
                             "MLflow cost")
    parser.add_argument("--also", action="append", default=[], metavar="OVERRIDES",
                        help="also run cupid-exp with these overrides (space-separated, e.g. 'runtime.workers=1'), "
                             "interleaved; repeatable")
    parser.add_argument("--close-connections", action="store_true",
                        help="the stub answers as HTTP/1.0, closing each connection after its reply (a new connection "
                             "per request), as some servers and proxies do; default: HTTP/1.1 keep-alive")
    args = parser.parse_args()
    if args.sweep == 1:
        parser.error("--sweep: at least 2 models")
    has_official = args.official is not None and (Path(args.official) / "evaluation" / "run.py").is_file()
    if args.official is not None and not has_official:
        print(f"no official checkout at {args.official}: cupid-exp only")

    work = Path(tempfile.mkdtemp(prefix="cupid-versus-"))
    try:
        data = write_dataset(work / "data.jsonl", args.instances)
        data_dir = official_instances(data, work / "official-data")
        store = migrated_store(work)
        official: list[dict[str, Any]] = []
        ours: list[dict[str, Any]] = []
        hung: list[str] = []
        variants: dict[str, list[dict[str, Any]]] = {"tracking.traces=false": [], "tracking=none": []}
        extra_rows: dict[str, list[dict[str, Any]]] = {}
        extra_runs: list[tuple[str, tuple[str, ...], Path]] = []
        if args.per_role_pools:
            extra_runs.append(("cupid-exp, each role its own pool", tuple(per_role_pools()), ROOT))
        extra_runs += [(f"cupid-exp `{overrides}`", tuple(overrides.split()), ROOT) for overrides in args.also]
        if args.compare is not None:
            extra_runs += [("before (--compare), at its defaults", (), args.compare),
                           (f"before (--compare), held to {args.concurrency} in flight by a split per role",
                            tuple(equal_in_flight(args.concurrency)), args.compare)]
        sweeps: dict[str, list[dict[str, Any]]] = {"official": [], "ours": []}
        with Stub(latency_ms=int(args.latency * 1000), model_ids=",".join(OFFICIAL_MODELS),
                  close_connections=args.close_connections) as stub:
            fresh = run_ours(args, stub, data, work, store=None)  # first run on this machine: store created
            for i in range(args.repeats):
                if has_official:
                    try:
                        official.append(run_official(args, stub, data_dir, work))
                    except Hung as exc:
                        hung.append(str(exc))
                        print(f"official  #{i + 1}: hung ({exc})")
                        continue
                    r = official[-1]
                    print(f"official  #{i + 1}: {r['wall']:.1f} s, {r['requests']} requests, "
                          f"{1000 * r['cpu'] / max(1, r['requests']):.2f} ms CPU each, {r['rss_max_mb']:.0f} MB "
                          f"(tree {r['rss_tree_mb']:.0f} MB), {r['mean_in_flight']:.1f} in flight on average")
                ours.append(run_ours(args, stub, data, work, store))
                r = ours[-1]
                print(f"cupid-exp #{i + 1}: {r['wall']:.1f} s (model phase {r['model_s']:.2f} s), "
                      f"{r['requests']} requests, {1000 * r['cpu'] / max(1, r['requests']):.2f} ms CPU each, "
                      f"{r['rss_max_mb']:.0f} MB (tree {r['rss_tree_mb']:.0f} MB), {r['mean_in_flight']:.1f} in flight "
                      f"on average, loop lag max {1000 * r['lag_max_s']:.0f} ms (p99 {1000 * r['lag_p99_s']:.0f} ms), "
                      f"stalls over 100 ms at {r['stalls']}, full collections {r['gen2']}")
                for name, overrides, tree in extra_runs:
                    extra_rows.setdefault(name, []).append(run_ours(args, stub, data, work, store, *overrides,
                                                                    tree=tree))
                    r = extra_rows[name][-1]
                    print(f"{name} #{i + 1}: {r['wall']:.1f} s (model phase {r['model_s']:.2f} s, peak "
                          f"{r['peak_in_flight']} in flight, {r['cpu']:.1f} CPU s)")
                if args.tracking_costs:
                    for override, runs in variants.items():
                        runs.append(run_ours(args, stub, data, work, store, override))
                        print(f"cupid-exp {override} #{i + 1}: {runs[-1]['wall']:.1f} s, {runs[-1]['cpu']:.1f} CPU s")
                if args.sweep:
                    if has_official:
                        sweeps["official"].append(run_official_series(args, stub, data_dir, work))
                        print(f"official  x{args.sweep} #{i + 1}: {sweeps['official'][-1]['wall']:.1f} s")
                    sweeps["ours"].append(run_ours_sweep(args, stub, data, work, store))
                    print(f"cupid-exp -m x{args.sweep} #{i + 1}: {sweeps['ours'][-1]['wall']:.1f} s "
                          f"(model phases {sweeps['ours'][-1]['model_s']:.2f} s)")
        report = render(args, has_official, official, ours, fresh, variants if args.tracking_costs else {}, extra_rows)
        if args.sweep:
            report += render_sweeps(args, has_official, sweeps, ours)
        if hung:
            report += (f"\n{len(hung)} official run(s) hung past {args.official_limit:.0f} s and were killed and left "
                       "out (that repeat's cupid-exp runs too): " + "; ".join(hung) + "\n")
        emit(report, args.out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def per_request_ms(runs: list[dict]) -> list[float]:
    return [1000 * r["cpu"] / r["requests"] for r in runs if r["requests"]]


def render(args: argparse.Namespace, has_official: bool, official: list[dict], ours: list[dict], fresh: dict,
           variants: dict[str, list[dict]], extra_rows: dict[str, list[dict]] | None = None) -> str:
    m = machine()
    load = os.getloadavg()
    lines = [
        f"## cupid-exp beside the official runner ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"`python bench/versus_official.py` on {time.strftime('%Y-%m-%d')}: {args.instances} instances, "
        f"task=inference, stub latency {args.latency * 1000:.0f} ms, concurrency {args.concurrency} "
        f"(official `--n_workers {args.concurrency}`, ours `max_concurrency={args.concurrency}` on every role, one "
        f"pool: at most {args.concurrency} in flight over all roles), {args.repeats} interleaved runs each; median "
        f"(min–max). The stub "
        + ("closes each connection after its reply (HTTP/1.0)." if args.close_connections else
           "keeps connections alive (HTTP/1.1)."),
        f"Machine: {m['nproc']} cores, {m['cpu']}, Python {m['python']}, litellm {m['litellm']}, "
        f"mlflow {m['mlflow']}; load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}.",
        "",
        "| | official | cupid-exp | ratio | target |",
        "|---|---|---|---|---|",
    ]
    w_ours = [r["wall"] for r in ours]
    model = [r["model_s"] for r in ours]
    fixed = [r["wall"] - r["model_s"] for r in ours]
    ideal = statistics.median(r["ideal_s"] for r in ours)
    if has_official:
        w_off = [r["wall"] for r in official]
        rss_ratio = (statistics.median(r["rss_max_mb"] for r in ours)
                     / statistics.median(r["rss_max_mb"] for r in official))
        lines += [
            f"| whole-process wall, s | {spread(w_off)} | {spread(w_ours)} | "
            f"{statistics.median(w_ours) / statistics.median(w_off):.2f} | ≤ 1.0 |",
            f"| requests served | {spread([r['requests'] for r in official], '{:.0f}')} | "
            f"{spread([r['requests'] for r in ours], '{:.0f}')} | | |",
            f"| micro F1 | {spread([r['micro_f1'] for r in official])} | {spread([r['micro_f1'] for r in ours])} | | |",
            f"| peak RSS, largest process, MB | {spread([r['rss_max_mb'] for r in official], '{:.0f}')} | "
            f"{spread([r['rss_max_mb'] for r in ours], '{:.0f}')} | "
            f"{rss_ratio:.2f} | ≤ 1.25 |",
            f"| peak RSS, process tree summed, MB | {spread([r['rss_tree_mb'] for r in official], '{:.0f}')} | "
            f"{spread([r['rss_tree_mb'] for r in ours], '{:.0f}')} | | |",
            f"| CPU seconds, process tree | {spread([r['cpu'] for r in official])} | "
            f"{spread([r['cpu'] for r in ours])} "
            "| | |",
            f"| CPU per request served, ms | {spread(per_request_ms(official), '{:.2f}')} | "
            f"{spread(per_request_ms(ours), '{:.2f}')} | "
            f"{statistics.median(per_request_ms(ours)) / statistics.median(per_request_ms(official)):.2f} | ≤ 1 |",
            f"| peak requests in flight (the stub's count) | "
            f"{spread([r['peak_in_flight'] for r in official], '{:.0f}')} | "
            f"{spread([r['peak_in_flight'] for r in ours], '{:.0f}')} | | |",
            f"| mean requests in flight, first arrival to last answer (the stub's) | "
            f"{spread([r['mean_in_flight'] for r in official])} | {spread([r['mean_in_flight'] for r in ours])} | "
            f"| ≥ {0.9 * args.concurrency:.0f} |",
        ]
        for name, runs in (extra_rows or {}).items():
            w_x = [r["wall"] for r in runs]
            lines += [f"| whole-process wall, {name}, s | {spread(w_off)} | {spread(w_x)} | "
                      f"{statistics.median(w_x) / statistics.median(w_off):.2f} | |",
                      f"| ... its model phase, s; peak / mean in flight; CPU per request, ms | | "
                      f"{spread([r['model_s'] for r in runs], '{:.2f}')}; "
                      f"{spread([r['peak_in_flight'] for r in runs], '{:.0f}')} / "
                      f"{spread([r['mean_in_flight'] for r in runs])}; "
                      f"{spread(per_request_ms(runs), '{:.2f}')} | | |"]
    else:
        lines += [f"| whole-process wall, s | – | {spread(w_ours)} | | |",
                  f"| peak RSS, largest process, MB | – | {spread([r['rss_max_mb'] for r in ours], '{:.0f}')} | | |",
                  f"| CPU per request served, ms | – | {spread(per_request_ms(ours), '{:.2f}')} | | |",
                  f"| peak requests in flight (the stub's count) | – | "
                  f"{spread([r['peak_in_flight'] for r in ours], '{:.0f}')} | | |",
                  f"| mean requests in flight, first arrival to last answer (the stub's) | – | "
                  f"{spread([r['mean_in_flight'] for r in ours])} | | ≥ {0.9 * args.concurrency:.0f} |"]
        for name, runs in (extra_rows or {}).items():
            lines += [f"| whole-process wall, {name}, s | – | {spread([r['wall'] for r in runs])} | | |",
                      f"| ... its model phase, s; peak / mean in flight; CPU per request, ms | | "
                      f"{spread([r['model_s'] for r in runs], '{:.2f}')}; "
                      f"{spread([r['peak_in_flight'] for r in runs], '{:.0f}')} / "
                      f"{spread([r['mean_in_flight'] for r in runs])}; "
                      f"{spread(per_request_ms(runs), '{:.2f}')} | | |"]
    lines += [
        f"| cupid-exp model phase, s | | {spread(model, '{:.2f}')} | "
        f"{statistics.median(model) / ideal:.2f} × ideal ({ideal:.2f} s) | ≤ 1.15 |",
        f"| cupid-exp fixed cost (wall − model phase), s | | {spread(fixed)} | | |",
        f"| cupid-exp event-loop lag in the model phase, worst / 99th percentile, ms (sampled every 10 ms) | | "
        f"{spread([1000 * r['lag_max_s'] for r in ours], '{:.0f}')} / "
        f"{spread([1000 * r['lag_p99_s'] for r in ours], '{:.0f}')} | | ≤ 100 |",
        f"| cupid-exp loop stalls over 100 ms; of them during a full collection (GC generation 2) | | "
        f"{spread([len(r['stalls']) for r in ours], '{:.0f}')}; {spread([gc_stalls(r) for r in ours], '{:.0f}')} "
        "| | 0 |",
        "",
        f"First run on a machine (no MLflow store yet: SQLite schema migrations): {fresh['wall']:.1f} s wall, "
        f"{fresh['wall'] - fresh['model_s']:.1f} s fixed cost.",
        "",
    ]
    if variants:
        requests = statistics.median(r["requests"] for r in ours)
        lines += ["What tracking costs (the same cupid-exp run with tracking reduced; per call = per request served):",
                  "", "| cupid-exp | wall, s | CPU, s | wall saved per call, ms | CPU saved per call, ms |",
                  "|---|---|---|---|---|",
                  f"| as above (MLflow run, progress, traces) | {spread(w_ours)} | "
                  f"{spread([r['cpu'] for r in ours])} | | |"]
        for override, runs in variants.items():
            wall = statistics.median(w_ours) - statistics.median(r["wall"] for r in runs)
            cpu = statistics.median(r["cpu"] for r in ours) - statistics.median(r["cpu"] for r in runs)
            lines.append(f"| `{override}` | {spread([r['wall'] for r in runs])} | {spread([r['cpu'] for r in runs])} | "
                         f"{1000 * wall / requests:.1f} | {1000 * cpu / requests:.1f} |")
        lines.append("")
    return "\n".join(lines)


def render_sweeps(args: argparse.Namespace, has_official: bool, sweeps: dict[str, list[dict]],
                  ours: list[dict]) -> str:
    n, runs = args.sweep, sweeps["ours"]
    wall = [r["wall"] for r in runs]
    fixed = [r["wall"] - r["model_s"] for r in runs]
    single = statistics.median(r["wall"] for r in ours)
    lines = ["", f"{n} models one after the other (the same workload each; cupid-exp: "
             "`-m model.params.temperature=…` "
             f"`calls.cache=false`, {n} jobs in one process; official: {n} runs back to back):", "",
             "| | official | cupid-exp | ratio |", "|---|---|---|---|"]
    if has_official:
        off = [r["wall"] for r in sweeps["official"]]
        lines.append(f"| wall, s | {spread(off)} | {spread(wall)} | "
                     f"{statistics.median(wall) / statistics.median(off):.2f} |")
        lines.append(f"| requests served | {spread([r['requests'] for r in sweeps['official']], '{:.0f}')} | "
                     f"{spread([r['requests'] for r in runs], '{:.0f}')} | |")
    else:
        lines.append(f"| wall, s | – | {spread(wall)} | |")
    lines += [f"| cupid-exp fixed cost of the sweep (wall − the jobs' model phases), s | | {spread(fixed)} | |",
              f"| cupid-exp wall per job after the first ((sweep − one job's run) / {n - 1}), s | | "
              f"{spread([(w - single) / (n - 1) for w in wall])} | |", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
