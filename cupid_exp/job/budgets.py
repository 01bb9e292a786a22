"""A job's budgets: ``calls.max_cost_usd`` over its attempts, ``calls.sweep_max_cost_usd`` over a sweep's jobs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cupid_exp.config import CallsConfig
from cupid_exp.llm.budget import LEDGER_FILE, Account, Budget

ESTIMATE_FILE = "budget_estimate.json"  #: a dry-run sweep's jobs add their estimates up here


def job_budget(calls: CallsConfig, *, job_ledger: Path, sweep_dir: str | None,
               spent: float = 0.0) -> Budget | None:
    """One job's accounts (its ledger, and a sweep's); ``spent``: what earlier attempts counted."""
    accounts: list[Account] = []
    job_caps = [(calls.max_cost_usd, "calls.max_cost_usd")]
    if sweep_dir is None:
        job_caps.append((calls.sweep_max_cost_usd, "calls.sweep_max_cost_usd"))
    set_caps = [(cap, key) for cap, key in job_caps if cap is not None]
    if set_caps:
        cap, key = min(set_caps)
        accounts.append(Account(str(job_ledger), float(cap), key, spent))
    if sweep_dir is not None and calls.sweep_max_cost_usd is not None:
        accounts.append(Account(str(Path(sweep_dir) / LEDGER_FILE), float(calls.sweep_max_cost_usd),
                                "calls.sweep_max_cost_usd", spent))
    return Budget(accounts) if accounts else None


@dataclass
class BudgetReport:
    """How a budgeted job ended: each account's spending, and the units left unrun by a stop."""

    accounts: list[tuple[Account, float]]
    not_run: int
    stopped: bool
    refused_calls: float  #: calls not sent (every process of the job)
    noun: str  #: what a unit of the job is (``job.spec.Work.noun``)

    def line(self) -> str:
        account, spent = min(self.accounts, key=lambda a: a[0].cap - a[1])  # the account closest to its cap
        return (f"BUDGET: ${spent:.4f} of ${account.cap:.4f} spent; {self.not_run} {self.noun}s not run; "
                f"resume with a higher budget ({account.key})")

    def status_line(self) -> str:
        return f"INCOMPLETE: {self.not_run} {self.noun}s not run: the budget was reached: exit 4"

    def metrics(self) -> dict[str, float]:
        out = {f"budget/{self.noun}s_not_run": float(self.not_run), "budget/stopped": float(self.stopped),
               "calls/not_sent_budget": float(self.refused_calls)}
        for account, spent in self.accounts:
            out[f"budget/{account.scope}/max_usd"] = account.cap
            out[f"budget/{account.scope}/spent_usd"] = spent
            out[f"budget/{account.scope}/left_usd"] = max(0.0, account.cap - spent)
        return out


def _verdict(what: str, estimate_usd: float, cap: float, key: str) -> str:
    share = f" ({100 * estimate_usd / cap:.0f}% of it)" if cap else ""
    if estimate_usd <= cap:
        return f"{what} ~${estimate_usd:.4f} fits {key}=${cap:.4f}{share}"
    return f"{what} ~${estimate_usd:.4f} does NOT fit {key}=${cap:.4f}{share}: it would stop at the budget (exit 4)"


def sweep_estimate(sweep_dir: str, estimate_usd: float) -> tuple[float, int]:
    """Add a dry-run job's estimate to its sweep's; the sweep's total so far and how many jobs it holds."""
    from filelock import FileLock

    path = Path(sweep_dir) / ESTIMATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=60):
        data = json.loads(path.read_text()) if path.exists() else {"usd": 0.0, "jobs": 0}
        data = {"usd": data["usd"] + estimate_usd, "jobs": data["jobs"] + 1}
        path.write_text(json.dumps(data))
    return float(data["usd"]), int(data["jobs"])


def fit_line(calls: CallsConfig, estimate_usd: float, sweep_dir: str | None = None) -> str | None:
    """The dry run's line: whether the estimate fits each budget; in a sweep, the jobs' estimates add up."""
    parts = []
    if calls.max_cost_usd is not None:
        parts.append(_verdict("the estimate", estimate_usd, calls.max_cost_usd, "calls.max_cost_usd"))
    if calls.sweep_max_cost_usd is not None:
        what, usd = "the estimate", estimate_usd
        if sweep_dir is not None:
            usd, jobs = sweep_estimate(sweep_dir, estimate_usd)
            what = f"the sweep's estimate so far ({jobs} jobs)"
        parts.append(_verdict(what, usd, calls.sweep_max_cost_usd, "calls.sweep_max_cost_usd"))
    return "budget: " + "; ".join(parts) if parts else None
