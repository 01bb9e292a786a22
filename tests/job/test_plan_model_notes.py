"""The plan says once, before the first call, which of the job's models litellm's map cannot vouch for:
one line per model, none for the stub's self-hosted endpoint beyond an info note."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import compose_config

from cupid_exp.evaluation import plan
from cupid_exp.testing.cupid_data import stub_overrides

UNREACHABLE = "http://127.0.0.1:9/v1"


def test_an_unknown_unpriced_subject_is_one_warning_when_the_plan_connects(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("TOGETHER_API_KEY", "tk-test-0000000000")
    evaluator_at_stub = [o for o in stub_overrides(UNREACHABLE) if not o.startswith("model")]
    cfg = compose_config(["model=deepseek_r1", *evaluator_at_stub, f"paths.output_root={tmp_path}", "tracking=none",
                          "runtime.progress=false"])
    with caplog.at_level(logging.INFO, logger="cupid_exp.job.checks"):
        job = plan(cfg, tmp_path / "job")  # builds the clients: no call is made
    assert job.ctx is not None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["model (deepseek_r1, together_ai/deepseek-ai/DeepSeek-R1): not in litellm's model map "
                        "(likely misspelt or retired by its provider); unpriced: its cost will read as unknown "
                        "(set model_info.input_cost_per_token and model_info.output_cost_per_token)"]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "evaluator.decomposer, evaluator.matcher (openai_compatible, openai/stub)" in infos[0]
