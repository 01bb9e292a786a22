"""The paper's experiments as presets (conf/experiment/): each composes its table's sweep one to one —
the models, settings, task and matcher of the paper's rows (cupid_exp/reporting/paper_reference.yaml) —
and previews it with calls.dry_run=true through the CLI's entry (in this process: the sweep's cost is Hydra
composing each job, not the process), with no model called."""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

import pytest
from conftest import CONF_DIR, compose_config
from helpers.cli_runner import run_job

from cupid_exp.job import typed_config
from cupid_exp.reporting.tables import GROUPS, load_reference
from cupid_exp.settings import make_setting
from cupid_exp.testing.cupid_data import sample_rows, write_jsonl

PRESETS = {"table1": ["table1"], "table3": ["table3"], "table9_10": ["table9", "table10"], "table11": ["table11"]}
REFERENCE = load_reference()


def sweep(preset: str, *overrides: str) -> tuple[object, dict[str, list[str]]]:
    cfg = compose_config([f"+experiment={preset}", *overrides], return_hydra_config=True)
    return cfg, {k: str(v).split(",") for k, v in cfg.hydra.sweeper.params.items()}


def test_every_preset_is_one_of_the_papers_tables() -> None:
    assert sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")) == sorted(PRESETS)
    assert sorted(t for tables in PRESETS.values() for t in tables) == sorted(REFERENCE["tables"])


@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_sweeps_exactly_its_tables_rows_and_columns(preset: str) -> None:
    cfg, params = sweep(preset)
    tables = [REFERENCE["tables"][t] for t in PRESETS[preset]]
    assert sorted(params.get("model", [cfg.model.name])) == sorted(REFERENCE["models"].values())
    settings = {t["setting"] for t in tables} | {c for t in tables for c in t["columns"] if c not in GROUPS}
    assert sorted(params.get("setting", [cfg.setting.name])) == sorted(settings)
    assert sorted(cfg.task.parts) == sorted({t["task"] for t in tables})
    matcher = {t.get("matcher") for t in tables if t["task"] == "inference"} or {"gpt4o"}
    assert {cfg.evaluator.name} == matcher and cfg.data.name == "cupid"


@pytest.mark.parametrize("preset", PRESETS)
def test_every_job_of_a_preset_composes_and_can_run(preset: str, tmp_path: Path) -> None:
    base, params = sweep(preset)
    keys = sorted(params)
    for values in itertools.product(*(params[k] for k in keys)):
        overrides = [f"+experiment={preset}", *(f"{k}={v}" for k, v in zip(keys, values, strict=False))]
        cfg = typed_config(compose_config([*overrides, f"paths.output_root={tmp_path}"]))
        make_setting(cfg.setting).check_parts(cfg.task.parts)
        assert cfg.evaluator.name == base.evaluator.name  # the preset's evaluator, whatever the model implies


def test_the_command_line_still_wins_over_a_preset() -> None:
    cfg, params = sweep("table11", "evaluator=gpt4o", "data=sample")
    assert cfg.evaluator.name == "gpt4o" and cfg.data.name == "sample"


# calls per instance: inference = infer, decompose, two matches; generation = generate, judge; summary = 1
CALLS = {"table1": 4, "table3": 2, "table9_10": 1 + 4 + 2, "table11": 4}
JOBS = {"table1": 20, "table3": 30, "table9_10": 10, "table11": 20}
TOTAL = re.compile(r"DRY RUN sweep total over (\d+) jobs: (\d+) calls, (\d+) prompt tokens, ~(\d+) completion "
                   r"tokens, ~\$([\d.]+)")


@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_is_previewed_by_a_dry_run(preset: str, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "small.jsonl", sample_rows()[:3])
    proc = run_job([sys.executable, "-m", "cupid_exp", "-m", f"+experiment={preset}", "calls.dry_run=true",
                    "data=local", f"data.path={data}", f"paths.output_root={tmp_path / 'out'}",
                    "runtime.progress=false"])
    (total,) = TOTAL.findall(proc.stdout)
    jobs, calls, prompt_tokens, _, cost = total
    assert int(jobs) == JOBS[preset] and proc.stdout.count("DRY RUN (no model was called)") == JOBS[preset]
    assert int(calls) == JOBS[preset] * 3 * CALLS[preset]
    assert int(prompt_tokens) > 0 and float(cost) > 0  # the evaluator (gpt-4o) is priced
