#!/usr/bin/env python
"""Which llama.cpp binding runs the embedded local model: xllamacpp vs llama-cpp-python, on the demo workload.

A script, not a test. Both engines run behind the same litellm provider (``cupid_exp/llm/local.py``,
``LocalModels``): the same request translation, the same error handling, the same settings from
``conf/llm/local.yaml`` (n_ctx, n_threads, n_batch, prompt cache). Only the object that turns an
OpenAI-style request into tokens differs:

  xllamacpp         the prebuilt wheel; llama.cpp's C++ server in-process (slot KV reuse + RAM prompt cache)
  llama-cpp-python  ``Llama.create_chat_completion`` (last-prompt KV reuse + ``LlamaRAMCache``); it has no
                    wheel on PyPI, so build it once into a throwaway directory (portable AVX2, as the
                    default -march=native build segfaults on AMX machines) and pass ``--llama-cpp-site``:

      CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \\
          pip wheel --no-deps --no-cache-dir -w /tmp/lcpp/wheels llama-cpp-python==0.3.36
      pip install --no-deps --target /tmp/lcpp/site /tmp/lcpp/wheels/llama_cpp_python-0.3.36-*.whl

What it measures, each in a fresh process:
  replay  the model calls of one default demo run (``python -m cupid_exp``, recorded once with
          xllamacpp), replayed in their order with the prompt cache on and off (``prompt_cache_mb``),
          so both engines do the same work: model load, prompt-processing and generation tok/s
          (llama.cpp's own timers), per-call latency by step, total wall, peak RSS;
  cli     the real default demo run, ``python -m cupid_exp`` with a fresh output dir (empty response
          cache, so every call reaches the model) and the engine swapped in: wall, peak RSS, the table.

    python bench/local_backend.py --llama-cpp-site /tmp/lcpp/site            # ~20 min on 2 cores
    python bench/local_backend.py --llama-cpp-site /tmp/lcpp/site --repeats 1 --skip-cli
    python bench/local_backend.py --only xllamacpp --skip-replay             # time the demo alone

Results go to stdout and (unless --no-write) to ``bench/local_backend.md`` (the part between the
generated-results markers; the prose around it is kept).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
ENGINES = ("xllamacpp", "llama-cpp-python")
RESULTS_MD = ROOT / "bench" / "local_backend.md"
BEGIN, END = "<!-- results: begin (written by bench/local_backend.py) -->", "<!-- results: end -->"


# ---------------------------------------------------------------------------------------------------------
# the llama-cpp-python engine (same interface as cupid_exp.llm.local.XLlamaCppEngine)

class LlamaCppPythonEngine:
    """``Llama.create_chat_completion`` behind the interface ``LocalModels`` expects, with llama.cpp's timers."""

    def __init__(self, gguf: Path, cfg: Any):
        from llama_cpp import Llama, LlamaRAMCache

        self.llm = Llama(model_path=str(gguf), n_ctx=cfg.n_ctx, n_threads=cfg.n_threads,
                         n_threads_batch=cfg.n_threads_batch or cfg.n_threads, n_batch=cfg.n_batch,
                         n_ubatch=cfg.n_batch,
                         chat_format=cfg.chat_format, verbose=False)
        self.n_ctx = cfg.n_ctx
        self.cache_prompt = cfg.prompt_cache_mb > 0
        if self.cache_prompt:
            self.llm.set_cache(LlamaRAMCache(capacity_bytes=cfg.prompt_cache_mb * 2**20))

    def chat(self, request: dict[str, Any]) -> dict[str, Any]:
        import llama_cpp

        kwargs = {k: request[k] for k in ("temperature", "max_tokens", "top_p", "top_k", "stop", "seed")
                  if k in request}
        fmt = request.get("response_format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":  # llama-cpp-python's spelling
            kwargs["response_format"] = {"type": "json_object", "schema": fmt["json_schema"]["schema"]}
        elif fmt is not None:
            kwargs["response_format"] = fmt
        if not request.get("cache_prompt", True):
            self.llm.reset()  # forget the previous prompt: no prefix reuse at all
        ctx = self.llm._ctx.ctx
        llama_cpp.llama_perf_context_reset(ctx)
        try:
            out = self.llm.create_chat_completion(messages=request["messages"], **kwargs)
        except ValueError as exc:
            if "exceed context window" in str(exc):
                return {"error": {"code": 400, "type": "exceed_context_size_error", "message": str(exc)}}
            raise
        perf = llama_cpp.llama_perf_context(ctx)
        prompt_tokens = out["usage"]["prompt_tokens"]
        out["timings"] = {"prompt_n": perf.n_p_eval, "prompt_ms": perf.t_p_eval_ms,
                          "cache_n": max(0, prompt_tokens - perf.n_p_eval),
                          "predicted_n": perf.n_eval, "predicted_ms": perf.t_eval_ms}
        return out

    def close(self) -> None:
        self.llm.close()


def _engine_factory(engine: str):
    if engine == "xllamacpp":
        from cupid_exp.llm.local import XLlamaCppEngine

        return XLlamaCppEngine
    return LlamaCppPythonEngine


def _step_of(messages: list[dict]) -> str:
    system = str(messages[0].get("content") or "") if messages else ""
    for key, step in (("infer the implicit preference", "infer"), ("preference and a numbered checklist", "match"),
                      ("evaluation checklist", "decompose")):
        if key in system:
            return step
    return "other"


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------------------------------------
# child processes

def child_replay(args: argparse.Namespace) -> None:
    """Replay recorded calls through LocalModels with one engine; print one JSON object."""
    from omegaconf import OmegaConf

    from cupid_exp.config import LocalModelConfig
    from cupid_exp.llm.local import LocalModels

    local = OmegaConf.load(ROOT / "conf" / "llm" / "local.yaml").local
    cfg = replace(LocalModelConfig(**OmegaConf.to_container(local)), prompt_cache_mb=args.prompt_cache_mb)
    calls = [json.loads(line) for line in Path(args.calls).read_text().splitlines() if line.strip()]
    models = LocalModels(engine_factory=_engine_factory(args.engine))
    models.register("m", cfg)
    start = time.perf_counter()
    models.engine("m")
    load_s = time.perf_counter() - start
    rows = []
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    for call in calls:
        t0 = time.perf_counter()
        row = {"step": _step_of(call["messages"])}
        try:
            out = models.complete("m", call["messages"], call["params"])
            timings = out.get("timings") or {}
            row.update(ok=True, prompt_tokens=out["usage"]["prompt_tokens"],
                       completion_tokens=out["usage"]["completion_tokens"],
                       cached=timings.get("cache_n", 0), prompt_n=timings.get("prompt_n", 0),
                       prompt_ms=timings.get("prompt_ms", 0.0), predicted_n=timings.get("predicted_n", 0),
                       predicted_ms=timings.get("predicted_ms", 0.0))
        except Exception as exc:  # noqa: BLE001  # a failed call is a result here, not a crash
            row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:200]}")
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
    total = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    models.close()
    print(json.dumps({"engine": args.engine, "prompt_cache_mb": args.prompt_cache_mb, "load_s": load_s,
                      "total_s": total, "cpu_s": cpu, "load_avg": os.getloadavg()[0],
                      "peak_rss_mb": _peak_rss_mb(), "calls": rows}))


MICRO = {
    # the demo's first preference-inference prompt (~2.1k tokens), answered without a schema
    "long prompt": None,
    "short prompt": [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}],
}


def child_micro(args: argparse.Namespace) -> None:
    """One cold 2.1k-token prompt and one short prompt, 128 tokens each, no schema, no prompt cache."""
    from omegaconf import OmegaConf

    from cupid_exp.config import LocalModelConfig
    from cupid_exp.llm.local import LocalModels

    local = OmegaConf.load(ROOT / "conf" / "llm" / "local.yaml").local
    cfg = replace(LocalModelConfig(**OmegaConf.to_container(local)), prompt_cache_mb=0)
    first = json.loads(Path(args.calls).read_text().splitlines()[0])
    models = LocalModels(engine_factory=_engine_factory(args.engine))
    models.register("m", cfg)
    start = time.perf_counter()
    models.engine("m")
    out = {"engine": args.engine, "load_s": time.perf_counter() - start}
    for name, messages in MICRO.items():
        t0 = time.perf_counter()
        reply = models.complete("m", messages or first["messages"], {"temperature": 0, "seed": 0, "max_tokens": 128})
        wall = time.perf_counter() - t0
        timings = reply.get("timings") or {}
        out[name] = {"prompt_tokens": reply["usage"]["prompt_tokens"], "prompt_ms": timings.get("prompt_ms", 0.0),
                     "completion_tokens": reply["usage"]["completion_tokens"], "wall_s": wall}
    out["peak_rss_mb"] = _peak_rss_mb()
    print(json.dumps(out))


def child_cli(args: argparse.Namespace, overrides: list[str]) -> None:
    """Run ``python -m cupid_exp <overrides>`` in this process with the given engine (and record its calls)."""
    import runpy

    from cupid_exp.llm import local

    models = local.local_models()
    models.engine_factory = _engine_factory(args.engine)
    if args.record:
        record = open(args.record, "w", encoding="utf-8")  # noqa: SIM115  # closed at exit
        complete = models.complete

        def recording(name: str, messages: list[dict], params: dict[str, Any]) -> dict[str, Any]:
            keep = {k: v for k, v in params.items() if k in local._PASSED_PARAMS}
            out = complete(name, messages, params)
            record.write(json.dumps({"model": name, "messages": messages, "params": keep,
                                     "usage": out.get("usage"), "timings": out.get("timings")}) + "\n")
            record.flush()
            return out

        models.complete = recording
    sys.argv = ["cupid_exp", *overrides]
    runpy.run_module("cupid_exp", run_name="__main__", alter_sys=True)


# ---------------------------------------------------------------------------------------------------------
# the parent

def _run_child(argv: list[str], site: str | None) -> tuple[str, str, float, float, int, float]:
    """Run a child; return stdout, stderr, wall seconds, peak RSS in MB, exit code, CPU seconds."""
    env = dict(ENV)
    if site:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (out.read().decode(errors="replace"), err.read().decode(errors="replace"), wall,
                usage.ru_maxrss / 1024, proc.returncode, usage.ru_utime + usage.ru_stime)


def _site_for(engine: str, site: str | None) -> str | None:
    return site if engine == "llama-cpp-python" else None


def record_calls(path: Path, overrides: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [__file__, "_cli", "--engine", "xllamacpp", "--record", str(path), "--",
                f"paths.output_root={tmp}", "runtime.progress=false", *overrides]
        _, err, wall, _, code, _ = _run_child(argv, None)
    if code != 0:
        raise SystemExit(f"recording the demo's calls failed:\n{err[-3000:]}")
    print(f"recorded {sum(1 for _ in path.open())} calls in {wall:.1f} s -> {path}", file=sys.stderr)


def replay(engine: str, calls: Path, prompt_cache_mb: int, site: str | None) -> dict[str, Any]:
    out, err, wall, rss, code, _ = _run_child([__file__, "_replay", "--engine", engine, "--calls", str(calls),
                                            "--prompt-cache-mb", str(prompt_cache_mb)], _site_for(engine, site))
    if code != 0:
        raise SystemExit(f"replay with {engine} failed:\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["process_wall_s"], result["process_peak_rss_mb"] = wall, rss
    return result


def micro(engine: str, calls: Path, site: str | None) -> dict[str, Any]:
    out, err, _, _, code, _ = _run_child([__file__, "_micro", "--engine", engine, "--calls", str(calls)],
                                         _site_for(engine, site))
    if code != 0:
        raise SystemExit(f"micro with {engine} failed:\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["load_avg"] = os.getloadavg()[0]
    return result


def run_cli(engine: str, site: str | None, overrides: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [__file__, "_cli", "--engine", engine, "--", f"paths.output_root={tmp}",
                "runtime.progress=false", *overrides]
        load_before = os.getloadavg()[0]
        out, err, wall, rss, code, cpu = _run_child(argv, _site_for(engine, site))
    if code != 0:
        raise SystemExit(f"the demo with {engine} failed:\n{err[-3000:]}")
    table = out[out.find("CUPID inference"):].strip() if "CUPID inference" in out else out.strip()
    calls = re.search(r"calls: (\d+) \((\d+) cached\), tokens: (\d+) in / (\d+) out.*time: ([\d.]+)s", out)
    return {"engine": engine, "wall_s": wall, "cpu_s": cpu, "peak_rss_mb": rss, "table": table,
            "load_avg": (load_before, os.getloadavg()[0]),
            "calls": int(calls.group(1)) if calls else None, "cached": int(calls.group(2)) if calls else None,
            "tokens_in": int(calls.group(3)) if calls else None,
            "tokens_out": int(calls.group(4)) if calls else None,
            "model_s": float(calls.group(5)) if calls else None}


def _decode_tps(calls: list[dict[str, Any]]) -> float:
    """Generated tokens per second of wall time after the prompt: sampling and grammar included.

    The engines' own generation timers differ (llama-cpp-python's counts only the forward passes,
    xllamacpp's includes sampling with the grammar), so this is the comparable figure."""
    seconds = sum(c["wall_s"] for c in calls) - sum(c["prompt_ms"] for c in calls) / 1000
    tokens = sum(c["completion_tokens"] for c in calls)
    return tokens / seconds if seconds > 0 else 0.0


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    ok = [c for c in result["calls"] if c["ok"]]
    prompt_n = sum(c["prompt_n"] for c in ok)
    prompt_ms = sum(c["prompt_ms"] for c in ok)
    gen_n = sum(c["predicted_n"] for c in ok)
    gen_ms = sum(c["predicted_ms"] for c in ok)
    by_step = {}
    for step in ("infer", "decompose", "match"):
        walls = [c["wall_s"] for c in ok if c["step"] == step]
        if walls:
            by_step[step] = (statistics.mean(walls), max(walls), len(walls))
    return {"engine": result["engine"], "cache": result["prompt_cache_mb"] > 0, "load_s": result["load_s"],
            "total_s": result["total_s"], "cpu_s": result.get("cpu_s", 0.0), "load_avg": result.get("load_avg", 0.0),
            "rss": result["process_peak_rss_mb"], "calls": len(result["calls"]),
            "failed": len(result["calls"]) - len(ok),
            "prompt_tokens": sum(c["prompt_tokens"] for c in ok), "processed": prompt_n,
            "cached": sum(c["cached"] for c in ok), "completion_tokens": sum(c["completion_tokens"] for c in ok),
            "pp_tps": prompt_n / (prompt_ms / 1000) if prompt_ms else 0.0,
            "tg_tps": gen_n / (gen_ms / 1000) if gen_ms else 0.0,
            "decode_tps": _decode_tps(ok),
            "mean_call_s": statistics.mean(c["wall_s"] for c in ok) if ok else 0.0, "by_step": by_step}


def _range(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return fmt.format(lo) if len(values) == 1 or fmt.format(lo) == fmt.format(hi) else \
        f"{fmt.format(lo)}–{fmt.format(hi)}"


def report(replays: list[dict[str, Any]], clis: list[dict[str, Any]], n_calls: int,
           micros: list[dict[str, Any]] | None = None) -> str:
    lines = [f"Machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
             f"Python {platform.python_version()}, load average at the end "
             f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.",
             ""]
    if micros:
        lines += ["**Engine micro-benchmark** (no schema, no prompt cache, 128 tokens asked; the long prompt is the "
                  "demo's first preference-inference prompt; prompt tok/s from the engine's timer, generation tok/s = "
                  "completion tokens / (call wall − prompt time), so sampling is included for both):", "",
                  "| engine | load s | long prompt tokens | prompt tok/s | gen tok/s after it | "
                  "gen tok/s, short prompt | peak RSS MB | load avg |", "|---|---|---|---|---|---|---|---|"]
        for engine in ENGINES:
            rows = [m for m in micros if m["engine"] == engine]
            if not rows:
                continue

            def pp(m):
                return m["long prompt"]["prompt_tokens"] / (m["long prompt"]["prompt_ms"] / 1000)

            def tg(m, key):
                c = m[key]
                return c["completion_tokens"] / (c["wall_s"] - c["prompt_ms"] / 1000)

            lines.append(f"| {engine} | {_range([m['load_s'] for m in rows], '{:.2f}')} | "
                         f"{_range([m['long prompt']['prompt_tokens'] for m in rows], '{:.0f}')} | "
                         f"{_range([pp(m) for m in rows], '{:.0f}')} | "
                         f"{_range([tg(m, 'long prompt') for m in rows])} | "
                         f"{_range([tg(m, 'short prompt') for m in rows])} | "
                         f"{_range([m['peak_rss_mb'] for m in rows], '{:.0f}')} | "
                         f"{_range([m['load_avg'] for m in rows])} |")
        lines.append("")
    if replays:
        lines += [f"**Replay of the demo's {n_calls} model calls** (ranges over the repeats; tok/s from llama.cpp's "
                  "own timers; per-call latency is the provider's wall time per call):", "",
                  "| engine | prompt cache | load s | prompt tokens (processed / reused) | prompt tok/s | "
                  "gen tokens | gen tok/s (engine timer) | gen tok/s (wall) | mean call s | "
                  "infer / decompose / match call s (mean) | "
                  "total s | CPU s | peak RSS MB | failed | load avg |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for engine in ENGINES:
            for cache in (True, False):
                rows = [summarise(r) for r in replays if r["engine"] == engine and (r["prompt_cache_mb"] > 0) == cache]
                if not rows:
                    continue
                steps = " / ".join(_range([r["by_step"][s][0] for r in rows if s in r["by_step"]], "{:.2f}")
                                   for s in ("infer", "decompose", "match"))
                lines.append(
                    f"| {engine} | {'on' if cache else 'off'} | {_range([r['load_s'] for r in rows], '{:.2f}')} | "
                    f"{_range([r['processed'] for r in rows], '{:.0f}')} / "
                    f"{_range([r['cached'] for r in rows], '{:.0f}')} | "
                    f"{_range([r['pp_tps'] for r in rows], '{:.0f}')} | "
                    f"{_range([r['completion_tokens'] for r in rows], '{:.0f}')} | "
                    f"{_range([r['tg_tps'] for r in rows], '{:.1f}')} | "
                    f"{_range([r['decode_tps'] for r in rows], '{:.1f}')} | "
                    f"{_range([r['mean_call_s'] for r in rows], '{:.2f}')} | "
                    f"{steps} | {_range([r['total_s'] for r in rows])} | {_range([r['cpu_s'] for r in rows])} | "
                    f"{_range([r['rss'] for r in rows], '{:.0f}')} | {_range([r['failed'] for r in rows], '{:.0f}')} | "
                    f"{_range([r['load_avg'] for r in rows])} |")
        lines.append("")
    if clis:
        lines += ["**The real demo**, `python -m cupid_exp` (default config, fresh output dir, so an empty "
                  "response cache), whole process:", "",
                  "| engine | wall s | CPU s | model phase s | calls (cached) | tokens in / out | peak RSS MB | "
                  "load avg (start, end) |",
                  "|---|---|---|---|---|---|---|---|"]
        for engine in ENGINES:
            rows = [c for c in clis if c["engine"] == engine]
            if rows:
                lines.append(f"| {engine} | {_range([r['wall_s'] for r in rows])} | "
                             f"{_range([r['cpu_s'] for r in rows])} | "
                             f"{_range([r['model_s'] for r in rows if r['model_s'] is not None])} | "
                             f"{_range([r['calls'] for r in rows if r['calls'] is not None], '{:.0f}')} "
                             f"({_range([r['cached'] for r in rows if r['cached'] is not None], '{:.0f}')}) | "
                             f"{_range([r['tokens_in'] for r in rows if r['tokens_in'] is not None], '{:.0f}')} / "
                             f"{_range([r['tokens_out'] for r in rows if r['tokens_out'] is not None], '{:.0f}')} | "
                             f"{_range([r['peak_rss_mb'] for r in rows], '{:.0f}')} | "
                             + ", ".join(f"({a:.1f}, {b:.1f})" for a, b in (r["load_avg"] for r in rows)) + " |")
        for engine in ENGINES:
            rows = [c for c in clis if c["engine"] == engine]
            if rows:
                lines += ["", f"Table printed by the last {engine} run:", "", "```", rows[-1]["table"], "```"]
    return "\n".join(lines) + "\n"


def write_md(text: str) -> None:
    old = RESULTS_MD.read_text() if RESULTS_MD.exists() else f"# Local model backend\n\n{BEGIN}\n{END}\n"
    if BEGIN not in old or END not in old:
        old = old.rstrip() + f"\n\n{BEGIN}\n{END}\n"
    head, rest = old.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    RESULTS_MD.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")


def main() -> None:
    argv = sys.argv[1:]
    overrides: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, overrides = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "_replay", "_cli", "_micro"])
    parser.add_argument("--engine", choices=ENGINES, default="xllamacpp")
    parser.add_argument("--only", choices=ENGINES, help="benchmark one engine only")
    parser.add_argument("--llama-cpp-site", help="directory holding an installed llama_cpp package")
    parser.add_argument("--calls", default=str(ROOT / "outputs" / "bench" / "local_backend_calls.jsonl"))
    parser.add_argument("--rerecord", action="store_true", help="record the demo's calls again")
    parser.add_argument("--record", help="(_cli) write the calls made to this JSONL file")
    parser.add_argument("--prompt-cache-mb", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-replay", action="store_true")
    parser.add_argument("--skip-cli", action="store_true")
    parser.add_argument("--no-cache-off", action="store_true", help="replay with the prompt cache on only")
    parser.add_argument("--micro", type=int, default=3, help="rounds of the engine micro-benchmark (0: none)")
    parser.add_argument("--raw", default=str(ROOT / "outputs" / "bench" / "local_backend_raw.json"),
                        help="all measurements as JSON (new ones are added to it unless --fresh)")
    parser.add_argument("--fresh", action="store_true", help="start a new raw file instead of adding to it")
    parser.add_argument("--report-only", action="store_true", help="rewrite the report from --raw, measure nothing")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    if args.mode == "_replay":
        return child_replay(args)
    if args.mode == "_cli":
        return child_cli(args, overrides)
    if args.mode == "_micro":
        return child_micro(args)

    engines = [] if args.report_only else [args.only] if args.only else list(ENGINES)
    if "llama-cpp-python" in engines and not args.llama_cpp_site:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            raise SystemExit("llama-cpp-python is not importable: pass --llama-cpp-site (see the docstring) "
                             "or --only xllamacpp") from None
    calls = Path(args.calls)
    raw_path = Path(args.raw)
    raw = json.loads(raw_path.read_text()) if raw_path.exists() and not args.fresh else \
        {"replays": [], "clis": [], "micros": []}
    replays, clis, micros = raw["replays"], raw["clis"], raw["micros"]
    if args.report_only:
        args.repeats, args.micro = 0, 0
    if (args.micro or not args.skip_replay) and engines and (args.rerecord or not calls.exists()):
        calls.parent.mkdir(parents=True, exist_ok=True)
        record_calls(calls, overrides)
    for round_ in range(args.micro):
        for engine in engines:
            micros.append(micro(engine, calls, args.llama_cpp_site))
            print(f"[{round_ + 1}/{args.micro}] micro  {engine:16} {json.dumps(micros[-1])}", file=sys.stderr)
            raw_path.write_text(json.dumps(raw))
    for repeat in range(args.repeats):
        for engine in engines:  # interleaved, so a change of machine load hits both engines
            if not args.skip_replay:
                for cache_mb in ((args.prompt_cache_mb,) if args.no_cache_off else (args.prompt_cache_mb, 0)):
                    result = replay(engine, calls, cache_mb, args.llama_cpp_site)
                    replays.append(result)
                    raw_path.write_text(json.dumps(raw))
                    s = summarise(result)
                    print(f"[{repeat + 1}/{args.repeats}] replay {engine:16} cache={'on ' if s['cache'] else 'off'} "
                          f"total {s['total_s']:6.1f} s  pp {s['pp_tps']:5.0f} tok/s  tg {s['tg_tps']:5.1f} tok/s  "
                          f"processed {s['processed']} reused {s['cached']}  rss {s['rss']:.0f} MB  "
                          f"failed {s['failed']}", file=sys.stderr)
            if not args.skip_cli:
                result = run_cli(engine, args.llama_cpp_site, overrides)
                clis.append(result)
                raw_path.write_text(json.dumps(raw))
                print(f"[{repeat + 1}/{args.repeats}] demo   {engine:16} wall {result['wall_s']:6.1f} s  "
                      f"model phase {result['model_s']} s  rss {result['peak_rss_mb']:.0f} MB", file=sys.stderr)
    n_calls = sum(1 for _ in calls.open()) if calls.exists() else 0
    text = report(replays, clis, n_calls, micros)
    print(text)
    if not args.no_write:
        write_md(text)


if __name__ == "__main__":
    main()
