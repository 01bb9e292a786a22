"""What a provider billed and what a job counted, read back after a run: the stub's bill at the job's prices, the
budget ledger's spend, the journal's records and the job's one line. Shared by the provider-fault tests and the fault
matrix."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from helpers.cli_runner import read_jsonl


def billed_usd(stats: dict[str, Any], price_in: float, price_out: float) -> float:
    """What the stub billed at these prices per token, less a rounding's worth (sums of floats in another order)."""
    return (stats["billed"]["prompt_tokens"] * price_in + stats["billed"]["completion_tokens"] * price_out) * (1 - 1e-9)


def settled(stub: Any, timeout: float = 15.0) -> dict[str, Any]:
    """The stub's counters once every request it received is finished (a slow one is billed after its client left)."""
    deadline = time.monotonic() + timeout
    while stub.stats()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return stub.stats()


def ledgers(root: Path, *, settled: bool = True) -> list[dict[str, Any]]:
    """Every budget ledger under ``root`` (one a job); ``settled``: none holding a reservation (every request
    settled; a killed process's are charged by the next one to open the ledger)."""
    found = [json.loads(p.read_text()) for p in sorted(Path(root).rglob("*budget.json"))]
    assert not settled or all(ledger["reservations"] == {} for ledger in found), found
    return found


def spent(root: Path) -> float:
    """The spend of the one budget ledger under ``root``."""
    (ledger,) = ledgers(root)
    return ledger["spent"]


def journals(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Each job's journal (by file name) as it stands, every line a whole record."""
    folder = Path(root) / "journal"
    return {p.name: read_jsonl(p) for p in sorted(folder.glob("*.jsonl"))} if folder.exists() else {}


def journaled(root: Path) -> list[dict[str, Any]]:
    """Every journaled record of every job under ``root``."""
    return [r for records in journals(root).values() for r in records]


def one_line(stderr: str, prefix: str) -> str:
    """The job's one line on stderr starting with ``prefix``; no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]
