"""The invariants every cell of the fault matrix is held to, whatever the fault and the mode:

- the documented exit code, and on a failure its one line: one line on stderr naming what happened (a sweep: one a
  job, or one a reason, then its list of the jobs that did not complete), no traceback; an incomplete job's line is
  the last of stdout (``INCOMPLETE: ...``), as the README shows it;
- no instance lost: after the resume, each job's journal holds every instance of its data, none failed (synthesis:
  the persona's three instances);
- the usage the jobs report (each job's last metrics.json: this attempt's and the earlier ones') is at least what the
  stub billed: cost, tokens and requests, a killed attempt's requests in flight included; the calls it reports are
  at most the replies billed (a cache hit is not a call); under a budget, the budget ledger holds the spend within it;
- no sentinel secret in any file under the cell's folder (output root, journal, cache, MLflow store) or in anything
  printed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Iterable

from helpers.cli_runner import read_jsonl
from helpers.spend import journals, ledgers

from faults.modes import Cell


def ending(proc: subprocess.CompletedProcess, cell: Cell, code: int, says: str = "") -> None:
    """The documented exit ``code``; a failure says so in one line (containing ``says``) and no traceback."""
    output = (proc.stdout[-2000:], [line[:300] for line in proc.stderr.splitlines()][-12:])
    assert proc.returncode == code, output
    if code < 0:  # killed: it said nothing
        return
    assert "Traceback" not in proc.stdout + proc.stderr, output
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    if code == 0:
        return
    if code == 3:  # incomplete: the output's last line (the README's example), nothing on stderr but a sweep's list
        endings = [line for line in proc.stdout.splitlines() if line.startswith("INCOMPLETE:")]
        assert len(endings) == cell.jobs and says in endings[-1], output
        assert [line for line in errors if not _sweep_list(line)] == [], output
        return
    lines = [line for line in errors if not _sweep_list(line)]
    if cell.jobs == 1:
        assert len(lines) == 1, output
    elif code > 128:  # a signal stops a sweep at once: one line a job it stopped (or one for the command)
        assert 1 <= len(lines) <= cell.jobs, output
    else:  # one line a job, or one a reason for jobs refused alike; then the sweep's list
        assert 1 <= len(lines) <= cell.jobs and any(line.startswith("sweep: ") for line in errors), output
    assert all(says in line for line in lines), output


def _sweep_list(line: str) -> bool:
    """The sweep's closing list: ``sweep: 2 of 2 jobs did not complete:`` and one indented line a job."""
    return line.startswith("sweep: ") or line.startswith("  ")


def finished(cell: Cell) -> None:
    """Every instance of every job is journaled, none failed (the last record of a key counts)."""
    if cell.mode == "synthesis":
        (instances,) = cell.root.glob("synthesis/*/instances/instances.jsonl")
        assert len(read_jsonl(instances)) == cell.instances
        assert _metrics(instances.parent.parent)["personas/completed"] == 1
        return
    found = journals(cell.root)
    assert len(found) == cell.jobs, sorted(found)
    for name, records in found.items():
        last = {r["key"]: r for r in records}
        assert len(last) == cell.instances, (name, sorted(last))
        assert not [r["errors"] for r in last.values() if r["errors"]], name


def job_metrics(cell: Cell) -> list[dict[str, float]]:
    """Each job's metrics as its last attempt wrote them (metrics.json; a resumed job's carry the earlier ones')."""
    if cell.mode == "synthesis":
        return [_metrics(p.parent) for p in cell.root.glob("synthesis/*/metrics.json")]
    latest: dict[str, tuple[float, dict[str, float]]] = {}
    for path in cell.root.rglob("metrics.json"):
        if not (path.parent / ".hydra").is_dir():
            continue  # MLflow's copy of it
        summary, when = json.loads(path.read_text()), path.stat().st_mtime
        job = summary["data"]["source"]
        if job not in latest or when > latest[job][0]:
            latest[job] = (when, summary["metrics"])
    return [metrics for _, metrics in latest.values()]


def reported(cell: Cell) -> dict[str, float]:
    """The whole usage the jobs report: each job's last metrics.json, this attempt's and the earlier ones', summed."""
    found = job_metrics(cell)
    assert len(found) == cell.jobs, found
    names = ("cost/usd", "tokens/prompt", "tokens/completion", "calls/total", "calls/requests")
    return {name: sum(m.get(name, 0.0) + m.get(f"{name}/earlier_attempts", 0.0) for m in found) for name in names}


def _metrics(folder: Path) -> dict[str, float]:
    return json.loads((folder / "metrics.json").read_text())["metrics"]


def spend_covers(cell: Cell, stats: dict[str, Any], billed: float, *, usage: bool = False) -> None:
    """The cost the jobs report covers what the stub billed (``billed``: its bill at the cell's prices). ``usage``:
    so do their prompt and completion tokens and requests (a killed attempt's requests in flight were billed though
    no reply came back: their worst case is counted), and no cache hit is counted as a call (each call counted is a
    reply billed)."""
    counted, paid = reported(cell), stats["billed"]
    shown = (counted, paid, billed)
    assert counted["cost/usd"] >= billed > 0, shown
    if usage:
        assert counted["tokens/prompt"] >= paid["prompt_tokens"], shown
        assert counted["tokens/completion"] >= paid["completion_tokens"], shown
        assert counted["calls/requests"] >= paid["requests"] >= counted["calls/total"], shown


def within_budget(cell: Cell, budget: float, billed: float) -> None:
    """Each job's budget ledger spent and holds no more than its budget (``calls.max_cost_usd`` is a job's), and
    together at least what was billed so far (a killed process's reservations are charged in full)."""
    found = ledgers(cell.root, settled=False)
    held = [entry["spent"] + sum(r["usd"] for r in entry["reservations"].values()) for entry in found]
    # a sweep's job that a kill stopped before it began has no ledger, and spent nothing
    assert 1 <= len(found) <= cell.jobs and all(usd <= budget for usd in held), found
    assert sum(held) >= billed, (found, billed)


def no_secret(folder: Path, outputs: Iterable[str], secrets: Iterable[str]) -> None:
    """No secret in any file under ``folder`` nor in any output."""
    secrets, outputs = list(secrets), list(outputs)
    found = [f"{p}: {s}" for p in sorted(folder.rglob("*")) if p.is_file() for s in secrets
             if s.encode() in p.read_bytes()]
    found += [f"output {i}: {s}" for i, text in enumerate(outputs) for s in secrets if s in text]
    assert found == []
