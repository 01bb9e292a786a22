"""The summary step runs under the model's own max_tokens, and a summary cut at that limit is counted
as ``summarize/truncated`` (after one more request with twice the max_tokens) with its raw texts kept — through the
real CLI, against the stub server."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import compose_config
from helpers.cli_runner import cli_command, job_dirs, metrics_of, read_jsonl, run_job

from cupid_exp.job import typed_config
from cupid_exp.testing.inprocess import InProcessModel
from cupid_exp.testing.stub_replies import classify


def test_no_setting_caps_the_models_max_tokens() -> None:
    for setting in ("standard", "oracle", "summary", "retrieval"):
        cfg = typed_config(compose_config(["model=gpt4o", f"setting={setting}"]))
        assert getattr(cfg.setting, "summary_params", {}) == {}


def test_the_summary_call_is_sent_with_the_models_own_max_tokens(tmp_path: Path) -> None:
    with InProcessModel(record_bodies=True) as stub:
        run_job(cli_command(stub, tmp_path, "setting=summary", "tracking=none", "data.limit=1",
                            "model.params.max_tokens=12345"))
        summaries = [b for b in stub.bodies if classify(b) == "summarize"]
    assert summaries and {b["max_tokens"] for b in summaries} == {12345}


def test_a_summary_cut_at_max_tokens_is_a_truncated_failure_with_its_text_kept(tmp_path: Path) -> None:
    with InProcessModel(length_steps=("summarize",), record_bodies=True) as stub:
        proc = run_job(cli_command(stub, tmp_path, "setting=summary", "task=both", "tracking=none",
                                   "data.limit=3", "model.params.max_tokens=300"), check=False)
        stats = stub.stats()
        limits = sorted(b["max_tokens"] for b in stub.bodies if classify(b) == "summarize")
    assert proc.returncode == 3, proc.stderr[-2000:]  # every instance failed: incomplete
    assert stats["faults"]["summarize"]["length"] == 6  # every summary cut, the longer request's too
    assert limits == [300] * 3 + [600] * 3  # asked once more with twice the max_tokens, never re-asked
    assert "summarize/truncated=3" in proc.stdout
    (job,) = job_dirs(tmp_path)
    for record in read_jsonl(job / "instances.jsonl"):
        assert [(e["step"], e["kind"]) for e in record["errors"]] == [("summarize", "truncated")]
        for raw in record["raw"]["summarize"]:
            assert raw.startswith("```json") and not raw.rstrip().endswith("```")  # the cut text, as it came
            json_part = raw.split("```json", 1)[1]
            try:
                json.loads(json_part)
                raise AssertionError("the stub's cut reply should not parse")
            except json.JSONDecodeError:
                pass
    assert metrics_of(job)["errors/summarize/truncated"] == 3.0
