"""Context too long: every provider's way of saying it becomes the failure kind ``context_length``.

It is not retried (the same prompt cannot fit on a second try), the instance keeps the error, and
the journal treats it as final: re-running the same command does not call the model again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers.cli_runner import cli_command, job_dirs, metrics_of, read_jsonl, run_job

from cupid_exp.config import CallsConfig, ModelConfig
from cupid_exp.llm.client import LLMClient, ProviderError, configure_litellm
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.inprocess import InProcessModel
from cupid_exp.testing.stub_faults import CONTEXT_ERRORS
from cupid_exp.testing.stub_llm_server import StubServer


@pytest.mark.parametrize("style", ["openai", "anthropic", "vllm", "llamacpp"])
def test_context_length_errors_of_every_style_are_classified(tmp_path: Path, style: str) -> None:
    rt = CallsConfig(cache_dir=str(tmp_path / "cache"), cache=False, num_retries=3, timeout=10)
    configure_litellm(rt)
    meter = UsageMeter()
    with StubServer(context_error=style) as stub:
        client = LLMClient(ModelConfig(name="stub", litellm_model="openai/stub", api_base=stub.url), rt, meter)
        with pytest.raises(ProviderError) as err:
            asyncio.run(client.complete([{"role": "user", "content": "a very long prompt"}], step="infer"))
        assert stub.stats()["total_received"] == 1  # not retried
    assert err.value.kind == "context_length"
    counts = meter.as_dict()["infer"]
    assert {k: v for k, v in counts.items() if not k.startswith("in_flight")} == {"failed_context_length": 1,
                                                                                 "retries": 0}
    assert counts["in_flight"] == 0  # the one request sent was settled by its failure


def test_styles_cover_the_providers_named_in_the_issue() -> None:
    status, body = CONTEXT_ERRORS["openai"]
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert "prompt is too long" in CONTEXT_ERRORS["anthropic"][1]["error"]["message"]
    assert "maximum context length" in CONTEXT_ERRORS["vllm"][1]["message"]


@pytest.mark.slow
def test_cli_records_context_length_as_its_own_final_failure_kind(tmp_path: Path) -> None:
    n = 4
    data = write_dataset(tmp_path / "data.jsonl", n)
    root = tmp_path / "out"
    with InProcessModel(context_error="anthropic", context_error_steps=("infer",)) as stub:
        cmd = cli_command(stub, root, "tracking=none", cache_dir=tmp_path / "cache", data=data)
        proc = run_job(cmd, check=False)
        assert proc.returncode == 3, proc.stderr[-2000:]  # every instance failed: incomplete
        assert stub.stats()["received"] == {"infer": n}  # one request each, no retries, nothing after
        (job,) = job_dirs(root)
        records = read_jsonl(job / "instances.jsonl")
        assert [[(e["step"], e["kind"]) for e in r["errors"]] for r in records] == [[("infer", "context_length")]] * n
        assert all("prompt is too long" in r["errors"][0]["message"] for r in records)
        metrics = metrics_of(job)
        assert metrics["errors/infer/context_length"] == n and metrics["calls/failed"] == n
        assert "infer/context_length=4" in proc.stdout
        assert f"{n} run, 0 scored, {n} failed" in proc.stdout
        assert proc.stdout.rstrip().splitlines()[-1] == (
            f"INCOMPLETE: {n} of {n} instances failed (infer/context_length={n}); "
            "above runtime.max_failed_fraction=0.1: exit 3")

        # final, not transient: the same command again serves every instance from the journal
        again = run_job(cmd, check=False)
        assert stub.stats()["received"] == {"infer": n}
    assert f"resuming: {n} of {n} instances already finished" in again.stdout + again.stderr
