"""What a job prints (also to ``results.txt``), ending with a line saying whether it is complete: scripts read it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from cupid_exp.llm.usage import UsageMeter, usage_line
from cupid_exp.outputs import atomic_write_text

if TYPE_CHECKING:  # imported by the tables when they are drawn, after the job's calls
    import pandas as pd

RESULTS_FILE = "results.txt"  # the printed results table (or a dry run's estimate), beside metrics.json
DRY_RUN_METRICS = ("calls/", "tokens/", "cost/", "time/", "data/", "resume/", "instances/total")  # what it measures


def in_job_log(message: str, level: int = logging.INFO) -> None:
    """Write ``message`` to the job's log file only (Hydra's file handler): the console has said it already."""
    record = logging.LogRecord("cupid_exp", level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def show(text: str, output_dir: Path) -> None:
    """Print the job's closing text, then keep it in its folder (``results.txt``) and its log file."""
    print(text, flush=True)
    atomic_write_text(Path(output_dir) / RESULTS_FILE, text.strip("\n") + "\n")
    in_job_log(text.strip("\n"))


def dry_run_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """What a dry run measured (calls, tokens, cost, time, data): not the scores of its placeholder replies."""
    return {k: v for k, v in metrics.items() if k.startswith(DRY_RUN_METRICS)}


PERCENT_COLUMNS = ("precision", "recall", "f1", "micro/precision", "micro/recall", "micro/f1")
HEADERS = {"inference": "inference P/R/F1 in %: macro (paper: mean per-instance P and R, F1 = their harmonic "
                        "mean) and micro (pooled, upstream)",
           "generation": "generation: mean judge score (1-10)"}


def results_table(nested: Mapping[str, Any]) -> pd.DataFrame:
    """One row per instance group (all, then each type): n and the task's numbers."""
    rows = []
    for group, block in nested.items():
        if group == "counts":
            continue
        row: dict[str, Any] = {"instances": group, "n": block.get("n", 0)}
        row.update({k: round(100 * block[k], 1) for k in PERCENT_COLUMNS if k in block})
        if "score" in block:
            row["score (1-10)"] = round(block["score"], 2)
        rows.append(row)
    import pandas as pd

    frame = pd.DataFrame(rows).set_index("instances")
    return frame.astype(object).where(frame.notna(), "-")  # "-" in a float column: as text, not a downcast


def header(kind: str, choices: Mapping[str, str]) -> str:
    return f"CUPID {kind} | " + " ".join(f"{k}={v}" for k, v in choices.items())


def job_report(title: str, nested: Mapping[str, Any], errors: Mapping[str, int], metrics: Mapping[str, float],
               n_bad_rows: int, where: str, status: str) -> str:
    lines = ["", title]
    for part, block in nested.items():
        counts = block.get("counts", {})
        lines += [HEADERS.get(part, part), results_table(block).to_string(),
                  f"{part} instances: {counts.get('instances', 0)} run, {counts.get('scored', 0)} scored, "
                  f"{counts.get('failed', 0)} failed (policy: {counts.get('failure_policy', '-')})"]
    warnings = int(metrics.get("data/oracle_count_warnings", 0))
    lines += [
        f"bad data rows skipped: {n_bad_rows}" + (f"; oracle count warnings: {warnings}" if warnings else ""),
        "failed steps: " + (", ".join(f"{k}={v}" for k, v in sorted(errors.items()) if "/" in k) or "none"),
        usage_line(dict(metrics), metrics.get("time/seconds")),
        f"outputs: {where}",
        status,
    ]
    return "\n".join(lines)


def dry_run_report(title: str, meter: UsageMeter, budget_line: str | None = None) -> str:
    """Calls, tokens and estimated cost per step of a dry run; ``budget_line``: whether it fits the budget."""
    rows = [{"step": step, "calls": int(c.get("calls", 0)), "prompt tokens": int(c.get("prompt_tokens", 0)),
             "completion tokens (est.)": int(c.get("completion_tokens", 0)),
             "cost USD (est.)": round(c.get("cost_usd", 0.0), 4), "unpriced calls": int(c.get("unpriced_calls", 0))}
            for step, c in meter.as_dict().items()]
    totals = meter.totals()
    import pandas as pd

    table = pd.DataFrame(rows).set_index("step").to_string() if rows else "(no calls)"
    unpriced = int(totals.get("unpriced_calls", 0))
    batch = totals.get("batch_cost_usd")
    return "\n".join([
        "", f"DRY RUN (no model was called) | {title}", table,
        f"total: {int(totals.get('calls', 0))} calls, {int(totals.get('prompt_tokens', 0))} prompt tokens, "
        f"~{int(totals.get('completion_tokens', 0))} completion tokens, ~${totals.get('cost_usd', 0.0):.4f}"
        + (f" ({unpriced} calls unpriced)" if unpriced else "")
        + (f"; with runtime.batch=true ~${batch:.4f} (Batch API prices where the provider has them)"
           if batch is not None and batch < totals.get("cost_usd", 0.0) else ""),
        *([budget_line] if budget_line else []),
    ])
