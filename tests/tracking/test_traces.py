"""One MLflow trace per instance: a span per model call with its step, model, messages, reply, tokens, cost,
latency, cache hit and retries; the scores as feedback; failed steps as errors; none with tracking.traces=false."""

from __future__ import annotations

import sys

import pytest
from helpers.cli_runner import job_dirs, read_jsonl, run_cli, run_job
from helpers.tracking_runs import job_command, job_runs, only_run, store_uri, traces_of

from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.inprocess import InProcessModel
from cupid_exp.testing.stub_llm_server import StubServer

N = 5


def _feedback(trace) -> dict:
    return {a.name: a for a in trace.info.assessments}


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> dict:
    """A task=both job in which instance 2 fails (its requests always get HTTP 500) and decompose replies are
    sometimes unusable (re-asked); then, on the same stub (the cache key covers its address), the same job's
    first 2 instances in a new output root sharing the response cache, and a job with tracking.traces=false; all
    in this process, on the in-process model."""
    tmp = tmp_path_factory.mktemp("traced")
    data = write_dataset(tmp / "data.jsonl", N)
    root, again, off = tmp / "out", tmp / "again", tmp / "off"
    common = ("task=both", "calls.num_retries=0", "runtime.max_failed_fraction=1")
    with InProcessModel(giveup_match="(variant 2)", garbage_steps=("decompose",), garbage_rate=0.4, seed=3) as model:
        first = run_job(job_command(model, root, data, *common))
        run_job(job_command(model, again, data, *common, "data.limit=2", cache_dir=root / "cache"))
        run_job(job_command(model, off, data, *common, "data.limit=2", "tracking.traces=false"))
    uri = store_uri(root)
    assert len(job_runs(uri)) == 1, first.stdout[-3000:] + first.stderr[-3000:]
    run = only_run(uri)
    (job,) = job_dirs(root)
    records = {r["key"]: r for r in read_jsonl(job / "instances.jsonl")}
    return {"run": run, "traces": traces_of(uri, run), "records": records, "again": store_uri(again),
            "off": store_uri(off), "root": root, "off_root": off}


def test_each_instance_is_one_trace_linked_to_its_run(traced) -> None:
    traces, records = traced["traces"], traced["records"]
    assert sorted(t.info.tags["cupid.key"] for t in traces) == sorted(records)
    for trace in traces:
        record = records[trace.info.tags["cupid.key"]]
        assert trace.info.trace_metadata["mlflow.sourceRun"] == traced["run"].info.run_id
        assert trace.info.tags["cupid.model"] == "openai_compatible" and trace.info.tags["cupid.setting"] == "standard"
        calls = [s for s in trace.data.spans if s.parent_id is not None]
        assert all(s.parent_id == trace.data.spans[0].span_id for s in calls)  # root, then one span per call
        ok = [s for s in calls if s.attributes.get("mlflow.chat.tokenUsage")]
        assert len(ok) == sum(u["calls"] for u in record["usage"].values())
        tokens = (trace.info.token_usage or {}).get("input_tokens", 0)  # none for an instance without a reply
        assert tokens == sum(u["prompt_tokens"] for u in record["usage"].values())


def test_the_runs_records_leave_out_the_replies_its_traces_hold(traced) -> None:
    """Each reply once in the run: in its instance's trace, not again in the run's copy of instances.jsonl (the job's
    folder keeps the whole file); without traces the run's copy keeps the replies."""
    (logged,) = traced["root"].glob("mlartifacts/**/instances.jsonl")
    rows = {r["key"]: r for r in read_jsonl(logged)}
    assert rows == {key: {k: v for k, v in r.items() if k != "raw"} for key, r in traced["records"].items()}
    assert any(r["raw"] for r in traced["records"].values())  # the job's folder: every reply
    (kept,) = traced["off_root"].glob("mlartifacts/**/instances.jsonl")
    assert any(r["raw"] for r in read_jsonl(kept))


def test_a_long_reply_is_whole_once_on_disk_in_the_journal_and_a_preview_elsewhere(tmp_path) -> None:
    """A reply past ``results.LONG_TEXT`` (200 KB here) is whole once in what we write: its record's journal line
    (what resume reads); the job's instances.jsonl, the run's artifacts and table, the generate span's reply and
    the judge span's prompt that quotes it keep a preview naming its length and sha256. The output root is searched
    for the stub's end marker, the cache folder left out (litellm's response cache holds the reply: a cache). The
    same command with the cache gone resumes from the journal: no call, the same records and scores."""
    import hashlib
    import shutil

    from helpers.jobs import stub_config

    from cupid_exp.evaluation import run_evaluation
    from cupid_exp.results import LONG_TEXT
    from cupid_exp.testing.cupid_data import SAMPLE_FULL_PATH

    cfg = ("task=generation", "tracking=mlflow", f"tracking.uri={store_uri(tmp_path)}", "data=local",
           f"data.path={SAMPLE_FULL_PATH}", "data.limit=1", f"calls.cache_dir={tmp_path / 'cache'}")
    with StubServer(long_steps=("generate",), long_bytes=200_000) as stub:
        assert run_evaluation(stub_config(stub.url, tmp_path, *cfg), tmp_path / "job").outcome == "ok"
        whole = {str(p.relative_to(tmp_path)): p.read_bytes().count(b"LONG-REPLY-END")
                 for p in tmp_path.rglob("*") if p.is_file() and "cache" not in p.parts}
        (journal,) = [k for k, n in whole.items() if n]  # the one file holding it, once
        assert journal.startswith("journal/") and journal.count("/") == 1 and whole[journal] == 1, whole
        assert {"mlflow.db", "job/instances.jsonl"} <= set(whole)
        assert [k for k in whole if k.endswith(("artifacts/instances.jsonl", "instances_table.json"))]
        (line,) = read_jsonl(tmp_path / journal)
        reply = line["response"]
        assert len(reply) > LONG_TEXT and "LONG-REPLY-END" in reply  # the stub's long reply, parsed whole
        note = f"{len(reply)} characters in all, sha256 {hashlib.sha256(reply.encode()).hexdigest()}"
        (record,) = read_jsonl(tmp_path / "job" / "instances.jsonl")
        assert note in record["response"] and len(record["response"]) < 3000 and note in record["raw"]["generate"][0]
        assert record["judge_score"] == line["judge_score"] is not None
        (trace,) = traces_of(store_uri(tmp_path), only_run(store_uri(tmp_path)))
        spans = {s.name: s for s in trace.data.spans}
        assert note in spans["generate"].outputs["choices"][0]["message"]["content"]
        judged = " ".join(m["content"] for m in spans["judge"].inputs["messages"])
        assert note in judged and reply[:100] in judged  # the prompt around the quote kept
        assert note in trace.data.spans[0].outputs["response"]
        shutil.rmtree(tmp_path / "cache")
        stub.reset()
        assert run_evaluation(stub_config(stub.url, tmp_path, *cfg), tmp_path / "job").outcome == "ok"
        assert stub.stats()["total_completed"] == 0
    assert read_jsonl(tmp_path / "job" / "instances.jsonl") == [record]
    assert read_jsonl(tmp_path / journal) == [line]


def test_in_a_call_span_only_a_long_reply_is_cut_where_quoted_and_a_long_prompt_stays_whole() -> None:
    """A history can pass ``LONG_TEXT`` on its own: a trace keeps such a prompt whole and cuts only the unit's long
    replies and answers, wherever a string holds them; a reply around its parsed answer keeps the answer's preview
    (the sha256 of what the journal keeps)."""
    from cupid_exp.results import LONG_TEXT, long_texts, preview, previewed

    history, reply = "a long history. " * (LONG_TEXT // 10), "a long answer. " * (LONG_TEXT // 10)
    quoted = long_texts(reply + "\n", reply, "short")
    assert quoted == (reply, reply + "\n")
    judge = {"messages": [{"role": "user", "content": f"Rubric first.\n{reply}\nScore it."}]}
    assert previewed({"messages": [{"content": history}]}, quoted) == {"messages": [{"content": history}]}
    assert previewed(judge, quoted)["messages"][0]["content"] == f"Rubric first.\n{preview(reply)}\nScore it."
    assert previewed({"content": reply + "\n"}, quoted) == {"content": preview(reply) + "\n"}


def test_a_call_span_has_step_model_messages_reply_tokens_cost_latency_cache_and_retries(traced) -> None:
    trace = next(t for t in traced["traces"] if not traced["records"][t.info.tags["cupid.key"]]["errors"])
    record = traced["records"][trace.info.tags["cupid.key"]]
    (infer,) = [s for s in trace.data.spans if s.name == "infer"]
    a = infer.attributes
    assert a["cupid.step"] == "infer" and a["cupid.model"] == "openai_compatible"
    assert a["mlflow.llm.model"] == "inproc/stub" and a["cupid.cache_hit"] is False and a["cupid.retries"] == 0
    assert a["cupid.latency_s"] > 0 and a["cupid.cost_usd"] > 0
    assert a["mlflow.llm.cost"]["total_cost"] == pytest.approx(a["cupid.cost_usd"])
    assert a["mlflow.chat.tokenUsage"]["input_tokens"] == record["usage"]["infer"]["prompt_tokens"]
    messages = infer.inputs["messages"]
    assert messages[-1]["role"] == "user" and record["instance_type"] and "variant" in str(messages)
    assert infer.outputs["choices"][0]["message"]["content"] == record["raw"]["infer"][0]
    assert infer.start_time_ns < infer.end_time_ns <= trace.data.spans[0].end_time_ns
    assert trace.info.state == "OK"
    # the scores, as feedback from the evaluator's models; the truth as an expectation
    fb = _feedback(trace)
    for name in ("precision", "recall", "f1"):
        assert fb[name].value == pytest.approx(record[name]) and fb[name].source.source_type == "LLM_JUDGE"
    assert fb["judge_score"].value == record["judge_score"] == 7.5
    assert fb["expected_preference"].value == record["gt_preference"]


def test_failed_steps_are_errors_and_unusable_replies_are_marked(traced) -> None:
    traces, records = traced["traces"], traced["records"]
    failed = [t for t in traces if records[t.info.tags["cupid.key"]]["errors"]]
    assert failed and all(t.info.state == "ERROR" for t in failed)
    provider = next(t for t in failed if "(variant 2)" in str(t.data.spans[0].inputs))
    bad = [s for s in provider.data.spans if s.status.status_code == "ERROR" and s.parent_id is not None]
    assert bad and all(e.attributes["exception.type"] == "provider" for s in bad for e in s.events)
    fb = _feedback(provider)
    assert fb["f1"].value is None and fb["f1"].error.error_code == "provider"
    assert fb["judge_score"].error is not None
    # a re-asked decompose: its first attempt's span is an error, the re-ask a span of its own
    reasks = [s for t in traces for s in t.data.spans if s.name == "decompose (attempt 2)"]
    assert reasks, "the stub's garbage rate gave no re-ask; pick another seed"
    firsts = [s for t in traces for s in t.data.spans if s.name == "decompose" and s.status.status_code == "ERROR"]
    assert firsts and all(e.attributes["exception.type"] == "unparseable" for s in firsts for e in s.events)


def test_a_cached_rerun_marks_cache_hits_and_traces_false_logs_no_trace(traced) -> None:
    uri = traced["again"]
    run = only_run(uri)
    spans = [s for t in traces_of(uri, run) for s in t.data.spans if s.attributes.get("mlflow.chat.tokenUsage")]
    assert spans and [(s.name, s.attributes["cupid.cache_hit"], s.attributes["mlflow.llm.cost"]) for s in spans] == [
        (s.name, True, {"total_cost": 0.0}) for s in spans]
    quiet = only_run(traced["off"])
    assert quiet.info.status == "FINISHED" and traces_of(traced["off"], quiet) == []


def test_calls_shared_by_two_processes_are_traced_counted_and_logged(tmp_path) -> None:
    """runtime.workers=2 through the CLI: each instance's trace, usage and failure reach the run, whichever
    process ran it, and the job says how many processes shared its calls."""
    data = write_dataset(tmp_path / "data.jsonl", 6)
    slots = [f"{role}.max_concurrency=2" for role in ("model", "evaluator.decomposer", "evaluator.matcher",
                                                       "evaluator.judge")]
    with StubServer(latency_ms=200, giveup_match="(variant 2)") as stub:
        done = run_cli(job_command(stub.url, tmp_path, data, "task=both", "calls.num_retries=0",
                                   "runtime.max_failed_fraction=1", "runtime.workers=2", *slots), timeout=240)
        received = stub.stats()["total_received"]
    uri = store_uri(tmp_path)
    run = only_run(uri)
    (job,) = job_dirs(tmp_path)
    records = {r["key"]: r for r in read_jsonl(job / "instances.jsonl")}
    assert run.info.status == "FINISHED" and len(records) == 6
    assert sorted(t.info.tags["cupid.key"] for t in traces_of(uri, run)) == sorted(records)
    assert run.data.metrics["calls/total"] == sum(u["calls"] for r in records.values() for u in r["usage"].values())
    assert run.data.metrics["calls/requests"] == received
    (failed,) = [key for key, r in records.items() if r["errors"]]
    log = done.stdout + done.stderr
    assert "model calls shared by 2 processes" in log and f"instance {failed}:" in log
    if sys.platform.startswith("linux"):  # a fresh process has called no model: its worker is forked
        assert "model calls shared by 2 processes (runtime.workers; forked)" in log
