"""CPU seconds per test, for ``bench/test_suite.md``: the suite is CPU-bound on 2 cores, so wall time per test (what
``--durations`` gives) says little about what a test costs the others running beside it.

Load it as a plugin and name a file for the figures (one JSON line per test, each xdist worker appending)::

    CUPID_TEST_CPU=/tmp/cpu.jsonl python -m pytest -p bench.test_cpu
    python -m bench.test_cpu /tmp/cpu.jsonl        # the costliest files and tests

A test's CPU is its worker's user + sys time over setup, call and teardown, plus its children's that were reaped
meanwhile (a CLI subprocess, an MLflow server, a pool's workers). A child still alive when the test ends (a kept
loky worker) is counted by the test that reaps it, or not at all.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from typing import Any

import pytest


def _cpu() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Any:
    path = os.environ.get("CUPID_TEST_CPU")
    if not path:
        yield
        return
    (own0, kids0), wall0 = _cpu(), time.perf_counter()
    yield
    (own1, kids1), wall1 = _cpu(), time.perf_counter()
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps({"test": item.nodeid, "cpu_s": round(own1 - own0, 3),
                              "children_s": round(kids1 - kids0, 3), "wall_s": round(wall1 - wall0, 3)}) + "\n")


def summarise(path: str, top: int = 40) -> str:
    with open(path, encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines]
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for r in rows:
        f = by_file[r["test"].split("::")[0]]
        f[0] += r["cpu_s"]
        f[1] += r["children_s"]
        f[2] += r["wall_s"]
        f[3] += 1
    total = sum(r["cpu_s"] + r["children_s"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    lines = [f"{len(rows)} tests, {total:.0f} CPU s (own + children), {wall:.0f} s summed wall",
             "", "| file | tests | CPU s own | CPU s children | wall s |", "|---|---|---|---|---|"]
    for name, (own, kids, wall, n) in sorted(by_file.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:top]:
        lines.append(f"| {name} | {n} | {own:.1f} | {kids:.1f} | {wall:.1f} |")
    lines += ["", "| test | CPU s own | CPU s children | wall s |", "|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: -(r["cpu_s"] + r["children_s"]))[:top]:
        lines.append(f"| {r['test']} | {r['cpu_s']:.1f} | {r['children_s']:.1f} | {r['wall_s']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarise(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40))
