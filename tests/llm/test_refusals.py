"""A provider's refusal (finish_reason ``content_filter``, or the ``refusal`` field of OpenAI's structured
outputs) is a failure of its own kind: counted per step in the table, metrics.json, instances.jsonl and
MLflow, never re-asked as if it were a format error, and left alone on resume unless runtime.retry_failed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from helpers.cli_runner import cli_command, job_dirs, metrics_of, read_jsonl, run_job
from mlflow.tracking import MlflowClient

from cupid_exp.config import CallsConfig, ModelConfig
from cupid_exp.llm.client import LLMClient, configure_litellm
from cupid_exp.llm.replies import ParseError
from cupid_exp.llm.steps import Reask, StepFailed, Transcript, ask
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.fault_server import ScriptedServer
from cupid_exp.testing.inprocess import InProcessModel

ASK = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]


def _client(url: str, tmp_path: Path, meter: UsageMeter) -> LLMClient:
    rt = CallsConfig(cache_dir=str(tmp_path / "c"), cache=False, num_retries=0, timeout=10)
    configure_litellm(rt)
    return LLMClient(ModelConfig(name="s", litellm_model="openai/scripted", api_base=url), rt, meter)


def _body(content: str | None, finish_reason: str, **message: str) -> dict:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "scripted",
            "choices": [{"index": 0, "finish_reason": finish_reason,
                         "message": {"role": "assistant", "content": content, **message}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 0, "total_tokens": 7}}


def _number(text: str) -> int:
    if not text.strip().isdigit():
        raise ParseError(f"not a number: {text!r}")
    return int(text)


@pytest.mark.parametrize("body", [
    _body(None, "content_filter"),  # Azure OpenAI's filter; litellm maps Anthropic's stop_reason "refusal" here too
    _body("", "content_filter"),
    _body(None, "stop", refusal="I'm sorry, I can't help with that."),  # OpenAI structured outputs
    _body("12 and th", "content_filter"),  # a reply the filter cut: unusable, and not asked again either
], ids=["null", "empty", "refusal-field", "cut"])
def test_a_refusal_fails_the_step_as_content_filter_with_one_request(tmp_path: Path, body: dict) -> None:
    meter, transcript = UsageMeter(), Transcript()
    with ScriptedServer([(200, body, {}), (200, _body("7", "stop"), {})]) as server:
        with pytest.raises(StepFailed) as failed:
            asyncio.run(ask(_client(server.url, tmp_path, meter), "count", ASK, _number, transcript=transcript,
                            retry=Reask(2)))
        sent = len(server.requests)
    assert sent == 1  # the next scripted reply would have parsed: it was never asked for
    assert failed.value.kind == "content_filter" and "refused" in str(failed.value)
    if body["choices"][0]["message"].get("refusal"):
        assert "can't help" in str(failed.value)
    counts = meter.as_dict()["count"]
    assert counts["content_filter_attempt"] == 1 and counts["calls"] == 1 and "gave_up" not in counts
    assert transcript.usage["count"]["calls"] == 1  # the paid request is in the instance's usage


def test_a_usable_reply_that_the_filter_let_through_is_kept(tmp_path: Path) -> None:
    with ScriptedServer([(200, _body("7", "content_filter"), {})]) as server:
        value = asyncio.run(ask(_client(server.url, tmp_path, UsageMeter()), "count", ASK, _number,
                                transcript=Transcript(), retry=Reask(1)))
    assert value == 7


N = 4


@pytest.mark.slow
def test_content_filter_is_counted_not_reasked_and_kept_on_resume(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    root = tmp_path / "out"
    with InProcessModel(content_filter_steps=("infer",)) as stub:
        cmd = cli_command(stub, root, "runtime.reask=2", "runtime.max_failed_fraction=1",
                          cache_dir=tmp_path / "cache", data=data)
        proc = run_job(cmd, timeout=240)
        infer_requests = stub.stats()["received"]["infer"]
        again = run_job(cmd, timeout=240)  # a resume: the refusals stand
        after_resume = stub.stats()["received"]["infer"]
        (first,) = job_dirs(root)
        retried = run_job([*cmd, "runtime.retry_failed=true"], timeout=240)  # (litellm caches no empty reply)
        after_retry = stub.stats()["received"]["infer"]

    assert infer_requests == N  # one request per instance: no re-ask
    assert after_resume == N and f"resuming: {N} of {N}" in again.stdout + again.stderr
    assert after_retry == 2 * N  # runtime.retry_failed=true asks again
    # retry_failed reports differently, so it writes a folder of its own (identity.REPORT_SETTINGS); its metrics are
    # the retry's own requests, refused again
    (job,) = set(job_dirs(root)) - {first}
    for record in read_jsonl(first / "instances.jsonl") + read_jsonl(job / "instances.jsonl"):
        assert [(e["step"], e["kind"]) for e in record["errors"]] == [("infer", "content_filter")]
        assert "refused" in record["errors"][0]["message"]
        assert "f1" not in record and "precision" not in record  # failed, not scored 0
        assert record["usage"]["infer"]["calls"] == 1
    metrics = metrics_of(job)
    assert metrics["errors/infer/content_filter"] == N and metrics["calls/infer/content_filter_attempt"] == N
    assert metrics["inference/count/scored"] == 0 and "inference/f1" not in metrics
    saved = json.loads((job / "metrics.json").read_text())
    assert saved["failure_reasons"] == {"infer/content_filter": N}
    assert f"infer/content_filter={N}" in proc.stdout.split("failed steps:")[1].splitlines()[0]
    assert proc.stdout.rstrip().splitlines()[-1].startswith(
        f"INCOMPLETE: {N} of {N} instances failed (infer/content_filter={N})")
    assert "unparseable" not in proc.stdout
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")  # two runs: retry_failed reports differently
    runs = [r for r in client.search_runs([client.get_experiment_by_name("cupid").experiment_id])
            if r.data.tags.get("cupid.kind") == "job"]
    assert runs and all(r.data.metrics["errors/infer/content_filter"] == N for r in runs)
    assert retried.returncode == 0
