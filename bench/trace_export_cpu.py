#!/usr/bin/env python
"""CPU per trace of the trace export (a script): N instances' traces (four calls each, their scores: the tests'
``tests/tracking/test_trace_batches.py: _write``) into a fresh SQLite store, batched as a job batches them; the
export thread's own CPU in ``BatchTraceExport.write`` over them, after a warm-up. A whole job's figure
(``cpu_profile.py``) moves by more than a cut in the export between runs.

Each checkout given runs this script in its own process (that checkout's code and tests on the path), the
checkouts interleaved, ``--rounds`` each:

    python bench/trace_export_cpu.py                  # this checkout
    python bench/trace_export_cpu.py /tmp/before .    # another checkout against this one, interleaved
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def one(traces: int) -> dict[str, float]:
    """The export thread's CPU per trace, in ms, and the batches it wrote them in."""
    import pytest

    sys.path.insert(0, str(Path.cwd() / "tests"))
    from tracking.test_trace_batches import _write

    from cupid_exp.tracking import trace_batches

    spent = [0.0]
    write = trace_batches.BatchTraceExport.write

    def timed(self: trace_batches.BatchTraceExport, batch: list) -> None:
        started = time.thread_time()
        try:
            write(self, batch)
        finally:
            spent[0] += time.thread_time() - started

    trace_batches.BatchTraceExport.write = timed  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        uri = f"sqlite:///{tmp}/mlflow.db"
        _write(uri, 8, batched=True, monkeypatch=patch, name="warm-up")
        spent[0] = 0.0
        _, batches = _write(uri, traces, batched=True, monkeypatch=patch, name="measured")
    return {"cpu_ms": 1000 * spent[0] / traces, "batches": batches.batches, "fallbacks": batches.fallbacks}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkouts", nargs="*", type=Path, default=[BENCH.parent])
    p.add_argument("--traces", type=int, default=400)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one measurement, as JSON
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.traces)))
        return
    runs: dict[Path, list[dict[str, float]]] = {c.resolve(): [] for c in args.checkouts}
    for _ in range(args.rounds):
        for checkout in runs:
            out = subprocess.run([sys.executable, __file__, "--one", "--traces", str(args.traces)], cwd=checkout,
                                 env={**os.environ, "PYTHONPATH": str(checkout)}, capture_output=True, text=True,
                                 check=True)
            runs[checkout].append(json.loads(out.stdout.splitlines()[-1]))
    load = os.getloadavg()
    print(f"`python bench/trace_export_cpu.py {' '.join(sys.argv[1:])}` on {time.strftime('%Y-%m-%d %H:%M')}: "
          f"{args.traces} traces; {os.cpu_count()} cores; load average at the end {load[0]:.1f}\n")
    print("| checkout | export CPU per trace, ms | batches |\n|---|---|---|")
    for checkout, measured in runs.items():
        cpu = [m["cpu_ms"] for m in measured]
        assert not any(m["fallbacks"] for m in measured), measured  # a batch written again trace by trace
        print(f"| {checkout} | {statistics.median(cpu):.2f} ({', '.join(f'{v:.2f}' for v in cpu)}) | "
              f"{', '.join(str(int(m['batches'])) for m in measured)} |")


if __name__ == "__main__":
    main()
