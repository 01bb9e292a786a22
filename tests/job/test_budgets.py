"""A job's budgets: which ledgers it draws on, and the dry run's verdict (the ledgers themselves: tests/llm)."""

from __future__ import annotations

from pathlib import Path

from cupid_exp.config import CallsConfig
from cupid_exp.job.budgets import fit_line, job_budget


def test_a_sweeps_jobs_share_the_sweep_ledger_and_each_keeps_its_own(tmp_path: Path) -> None:
    rt = CallsConfig(cache_dir="c", max_cost_usd=2.0, sweep_max_cost_usd=5.0)
    budget = job_budget(rt, job_ledger=tmp_path / "job.budget.json", sweep_dir=str(tmp_path / "sweep"))
    assert [(a.cap, a.scope) for a in budget.accounts] == [(2.0, "job"), (5.0, "sweep")]
    single = job_budget(CallsConfig(cache_dir="c", sweep_max_cost_usd=5.0), job_ledger=tmp_path / "j.json",
                        sweep_dir=None)
    assert [(a.cap, a.key) for a in single.accounts] == [(5.0, "calls.sweep_max_cost_usd")]
    assert job_budget(CallsConfig(cache_dir="c"), job_ledger=tmp_path / "j.json", sweep_dir=None) is None


def test_the_dry_run_says_whether_its_estimate_fits(tmp_path: Path) -> None:
    assert "fits calls.max_cost_usd=$1.0000" in fit_line(CallsConfig(cache_dir="c", max_cost_usd=1), 0.5)
    assert "does NOT fit" in fit_line(CallsConfig(cache_dir="c", max_cost_usd=1), 1.5)
    assert fit_line(CallsConfig(cache_dir="c"), 1.5) is None
    # a sweep's jobs add their estimates up: the last line holds the whole sweep's
    sweep = CallsConfig(cache_dir="c", sweep_max_cost_usd=1)
    first = fit_line(sweep, 0.6, str(tmp_path / "sweep"))
    second = fit_line(sweep, 0.6, str(tmp_path / "sweep"))
    assert first == ("budget: the sweep's estimate so far (1 jobs) ~$0.6000 fits calls.sweep_max_cost_usd=$1.0000 "
                     "(60% of it)")
    assert second.startswith("budget: the sweep's estimate so far (2 jobs) ~$1.2000 does NOT fit")


def test_a_sweep_with_a_budget_stop_exits_4_unless_a_job_had_a_bad_setting(tmp_path: Path, capsys) -> None:
    import json

    from omegaconf import OmegaConf

    from cupid_exp.entry import EXIT_BAD_INPUT, EXIT_BUDGET, Outcome, SweepReportCallback
    from cupid_exp.tracking.callbacks import STATUS_FILE

    assert Outcome("budget").exit_code == EXIT_BUDGET == 4

    def sweep_code(outcomes: list[str]) -> int:
        sweep = tmp_path / "-".join(outcomes)
        for i, outcome in enumerate(outcomes):
            (sweep / str(i)).mkdir(parents=True)
            (sweep / str(i) / STATUS_FILE).write_text(json.dumps({"job": str(i), "outcome": outcome, "reason": ""}))
        SweepReportCallback.exit_code = 0
        SweepReportCallback().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
        return SweepReportCallback.exit_code

    assert sweep_code(["ok", "incomplete", "budget"]) == EXIT_BUDGET
    assert sweep_code(["budget", "error", "incomplete"]) == EXIT_BAD_INPUT
    assert "  2: stopped by a budget: " in capsys.readouterr().err
    # a rate limit beyond the patience needs only time: after what needs a fix, before incomplete
    assert Outcome("retry_later").exit_code == 75
    assert sweep_code(["retry_later", "incomplete", "ok"]) == 75
    assert sweep_code(["retry_later", "budget"]) == EXIT_BUDGET
