"""Regenerate the README's MLflow screenshots from a real run (a script, not a test).

A two-job sweep (task=both, settings standard and oracle) runs through the real CLI against the stub
model server (cupid_exp/testing/stub_llm_server.py: 300 ms latency with jitter, priced like gpt-4o, one
persona's requests failing, some unusable decompositions), then `mlflow server` serves its store on
127.0.0.1 and headless Chromium (Debian's `chromium` package) photographs the pages a user looks at.
Chromium is driven over its DevTools protocol (with aiohttp, which litellm already installs) rather
than with `--screenshot`, because the pages need a little setting up first: MLflow 3.17 opens its
Assistant panel and a "Detect issues" tip on a fresh profile, and the runs table starts collapsed.
Each PNG is quantised to stay well under 300 KB.

    python docs/make_screenshots.py [--keep] [--outputs <kept work folder>/outputs] [--only mlflow-runs.png ...]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from cupid_exp.testing.cupid_data import stub_overrides, write_dataset
from cupid_exp.testing.stub_llm_server import StubServer

ROOT = Path(__file__).resolve().parents[1]

DOCS = ROOT / "docs"
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
ENV.pop("MLFLOW_TRACKING_URI", None)
PRICES = [f"{role}.model_info.{kind}_cost_per_token={price}"
          for role in ("model", "evaluator.decomposer", "evaluator.matcher", "evaluator.judge")
          for kind, price in (("input", "2.5e-06"), ("output", "1e-05"))]
CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
            "--remote-debugging-port=0"]
# What a fresh browser profile would otherwise show over the pages.
QUIET = {"mlflow.assistant.panelOpen_v1": "false", "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true",
         "mlflow.detectIssues.guidanceShown_v1": "true"}


def run_sweep(work: Path, n: int) -> Path:
    data = write_dataset(work / "synthetic-cupid.jsonl", n)
    outputs = work / "outputs"
    with StubServer(latency_ms=300, jitter_ms=300, giveup_match="(variant 5)", garbage_steps=("decompose",),
                    garbage_rate=0.2, seed=7) as stub:
        cmd = [sys.executable, "-m", "cupid_exp", "-m", *stub_overrides(stub.url), *PRICES,
               f"paths.output_root={outputs}", "runtime.progress=false", "calls.num_retries=0",
               "runtime.max_failed_fraction=1", "data=local", f"data.path={data}", "task=both",
               "setting=standard,oracle", "tracking.progress_every_s=1", "model.name=stub"]
        subprocess.run(cmd, cwd=ROOT, env=ENV, check=True, timeout=1800)
    return outputs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("mlflow server exited")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError("mlflow server did not come up")


class Browser:
    """Headless Chromium and one page, driven over the DevTools protocol."""

    async def __aenter__(self) -> "Browser":
        import aiohttp

        self.profile = tempfile.mkdtemp(prefix="cupid-chromium-")
        self.proc = subprocess.Popen([*CHROMIUM, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and port_file.read_text().strip():
                break
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as reply:
            page = next(t for t in await reply.json() if t["type"] == "page")
        self.ws = await self.session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self.ids = itertools.count(1)
        return self

    async def send(self, method: str, **params) -> dict:
        i = next(self.ids)
        await self.ws.send_json({"id": i, "method": method, "params": params})
        while True:
            message = await self.ws.receive_json()
            if message.get("id") == i:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    async def js(self, expression: str):
        reply = await self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        return reply.get("result", {}).get("value")

    async def open(self, url: str, wait: float, width: int = 1400, height: int = 900) -> None:
        await self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                        mobile=False)
        await self.send("Page.navigate", url="about:blank")
        await self.send("Page.navigate", url=url)
        await asyncio.sleep(wait)

    async def shot(self, path: Path) -> None:
        reply = await self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(reply["data"]))
        shrink(path)

    async def __aexit__(self, *exc) -> None:
        await self.ws.close()
        await self.session.close()
        self.proc.terminate()
        self.proc.wait(timeout=20)
        shutil.rmtree(self.profile, ignore_errors=True)


def shrink(path: Path, limit: int = 150_000) -> None:
    """Quantise to a palette while the file is over ``limit`` bytes (UI screenshots have few colours)."""
    from PIL import Image

    for colours in (256, 128, 64):
        if path.stat().st_size <= limit:
            return
        Image.open(path).convert("RGB").quantize(colours).save(path, optimize=True)


def _set_local(items: dict[str, str]) -> str:
    return ";".join(f"localStorage.setItem({json.dumps(k)}, {json.dumps(v)})" for k, v in items.items())


SCROLL_TO_STATE = """(() => { const state = Array.from(document.querySelectorAll('[role=columnheader], th'))
  .find(h => h.textContent.trim() === 'State');
  for (const e of document.querySelectorAll('*'))
    if (e.scrollWidth > e.clientWidth + 20 && getComputedStyle(e).overflowX !== 'visible' && e.contains(state))
      e.scrollLeft = state.getBoundingClientRect().left - e.getBoundingClientRect().left + e.scrollLeft - 40; })()"""
SEARCH_PROGRESS = """(() => { const i = document.querySelector('input[placeholder="Search metric charts"]');
  Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set.call(i, 'progress/');
  i.dispatchEvent(new Event('input', {bubbles: true})); })()"""
CLICK_SPAN = """(() => { const t = Array.from(document.querySelectorAll('span,div'))
  .find(x => x.children.length === 0 && x.textContent.trim() === 'infer'); t.click(); })()"""
SPAN_ATTRIBUTES = CLICK_SPAN.replace("t.click(); })()", """t.click();
  setTimeout(() => { const a = Array.from(document.querySelectorAll('*'))
    .find(x => x.children.length === 0 && x.textContent.trim() === 'Attributes');
    const tab = a.closest('button,[role=tab]') || a;  // Radix tabs switch on mousedown
    tab.dispatchEvent(new MouseEvent('mousedown', {bubbles: true})); tab.click(); }, 2000); })()""")
ASSESSMENTS_AND_TIMELINE = """(() => { for (const label of ['Assess trace', 'Show execution timeline'])
  Array.from(document.querySelectorAll('button')).find(b => (b.getAttribute('aria-label') || '').startsWith(label))
    .click(); })()"""


async def photograph(url: str, outputs: Path, only: list[str] | None) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")
    exp = client.get_experiment_by_name("cupid").experiment_id
    runs = client.search_runs([exp])
    parent = next(r for r in runs if r.data.tags.get("cupid.kind") == "sweep")
    job = next(r for r in runs
               if r.data.tags.get("cupid.kind") == "job" and r.data.params["setting.name"] == "standard")
    # the trace panel shows its summary line for a trace on the list's first page: take the latest finished one
    traces = client.search_traces(locations=[exp], max_results=100, include_spans=False,
                                  order_by=["timestamp_ms DESC"])
    trace = next(t for t in traces if t.info.state == "OK")
    base = f"{url}/#/experiments/{exp}"
    table_state = {"searchFilter": "", "orderByKey": "attributes.start_time", "orderByAsc": False, "startTime": "ALL",
                   "lifecycleFilter": "Active", "datasetsFilter": [], "modelVersionFilter": "All Runs",
                   "selectedColumns": ["attributes.`Dataset`", "metrics.`inference/f1`", "metrics.`generation/score`",
                                       "metrics.`cost/usd`", "metrics.`calls/total`"],
                   "runsExpanded": {parent.info.run_id: True}}
    local = {**QUIET, f'MLflowLocalStorage-1.1-ExperimentPage-["{exp}"]-ReactComponentState': json.dumps(table_state),
             f"MLflowLocalStorage-1.1-ExperimentView-{exp}-expandRows": "true"}
    # name -> (url, seconds to wait, window height, JS to run before the picture)
    shots = {"mlflow-runs.png": (f"{base}/runs", 8, 900, None),
             "mlflow-progress.png": (f"{base}/runs/{job.info.run_id}/model-metrics", 6, 1250, SEARCH_PROGRESS),
             "mlflow-overview.png": (f"{base}/overview/usage", 10, 1250, None),
             "mlflow-traces.png": (f"{base}/traces", 8, 900, SCROLL_TO_STATE),
             "mlflow-trace.png": (f"{base}/traces?selectedEvaluationId={trace.info.trace_id}", 14, 900,
                                  ASSESSMENTS_AND_TIMELINE),
             "mlflow-span.png": (f"{base}/traces?selectedEvaluationId={trace.info.trace_id}", 14, 900, CLICK_SPAN),
             "mlflow-span-attributes.png": (f"{base}/traces?selectedEvaluationId={trace.info.trace_id}", 14, 900,
                                            SPAN_ATTRIBUTES),
             "mlflow-evaluation-runs.png": (f"{base}/evaluation-runs", 8, 900, None),
             "mlflow-sweep-leaderboard.png": (f"{base}/runs/{parent.info.run_id}/artifacts/leaderboard.html", 8, 900,
                                              None)}
    async with Browser() as browser:
        await browser.open(f"{base}/runs", 2)
        await browser.js(_set_local(local))
        for name, (page, wait, height, script) in shots.items():
            if only and name not in only:
                continue
            await browser.open(page, wait, height=height)
            if script:
                await browser.js(script)
                await asyncio.sleep(8)
            await browser.shot(DOCS / name)
            print(f"{DOCS / name}: {(DOCS / name).stat().st_size // 1000} KB  <- {page}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=40)
    parser.add_argument("--keep", action="store_true", help="keep the work folder and print its path")
    parser.add_argument("--only", nargs="*", default=None, help="file names to (re)take")
    parser.add_argument("--outputs", type=Path, default=None, help="photograph this output root (no new sweep)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cupid-shots-"))
    server = None
    try:
        outputs = args.outputs.resolve() if args.outputs else run_sweep(work, args.instances)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
                                   str(port), "--backend-store-uri", f"sqlite:///{outputs / 'mlflow.db'}",
                                   "--workers", "1"], cwd=work, env=ENV, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        wait_healthy(url, server)
        asyncio.run(photograph(url, outputs, args.only))
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(server.pid, signal.SIGKILL)  # its huey workers can outlive a SIGTERM
            except ProcessLookupError:
                pass
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
