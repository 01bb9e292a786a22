"""Everything checkable is checked before the first model call, each in one line naming the setting,
the value and what is allowed; the real CLI turns each into exit 2 with no traceback."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from helpers.cli_runner import cli_command, job_dirs, read_jsonl, run_job
from helpers.jobs import stub_config
from helpers.prompt_dirs import full_prompt_folder

from cupid_exp.config import ConfigError
from cupid_exp.data.schema import DataError
from cupid_exp.evaluation import plan
from cupid_exp.prompts import PROJECT_PROMPTS
from cupid_exp.testing.cupid_data import make_rows, stub_overrides, write_jsonl
from cupid_exp.testing.inprocess import InProcessModel

UNREACHABLE = "http://127.0.0.1:9/v1"


def bad_prompts(tmp_path: Path) -> Path:
    folder = full_prompt_folder(tmp_path / "prompts") / "evaluation"
    (folder / "preference_inferrer.yaml").write_text("system_prompt: |-\n  Infer.\nuser_prompt: |-\n"
                                                     "  {interaction_log}\n  {user_name} asks: {curr_request}\n")
    return tmp_path / "prompts"


# (override, the one-line message's start or fragment)
BAD_SETTINGS = [
    ("runtime.failure_policy=bogus", "runtime.failure_policy='bogus' is not allowed: one of"),
    ("calls.timeout=0", "calls.timeout=0.0 is not allowed: a number > 0"),
    ("calls.timeout=-5", "calls.timeout=-5.0 is not allowed"),
    ("runtime.reask=-1", "runtime.reask=-1 is not allowed: an integer >= 0"),
    ("calls.num_retries=-2", "calls.num_retries=-2 is not allowed"),
    ("runtime.max_failed_fraction=1.5", "runtime.max_failed_fraction=1.5 is not allowed: a number in [0, 1]"),
    ("data.limit=-1", "data.limit=-1 is not allowed: an integer >= 1, or null"),
    ("data.limit=0", "data.limit=0 is not allowed"),
    ("data.instance_types=[bogus]", "data.instance_types=['bogus'] is not allowed"),
    ("evaluator.max_checklist_items=0", "evaluator.max_checklist_items=0 is not allowed: an integer >= 1"),
    ("evaluator.max_checklist_items=-1", "evaluator.max_checklist_items=-1 is not allowed"),
    ("model.max_concurrency=0", "model.max_concurrency=0 is not allowed: an integer >= 1"),
    ("model.params.max_tokens=0", "model.params.max_tokens=0 is not allowed"),
    ("model.system_role=admin", "model.system_role='admin' is not allowed"),
    ("model.context_window=-3", "model.context_window=-3 is not allowed"),
    ("+runtime.num_retry=3", "runtime.num_retry is not a setting of runtime; did you mean calls.num_retries?"),
    ("+evaluator.temperature=0", "evaluator.temperature is not a setting of evaluator"),
    ("setting=retrieval setting.top_k=0", "setting.top_k=0 is not allowed: an integer >= 1"),
    ("setting=retrieval setting.retriever=tfidf", "setting.retriever='tfidf' is not allowed"),
    ("setting=oracle setting.expected_oracle_sessions=0", "setting.expected_oracle_sessions=0 is not allowed"),
    ("task.parts=[inference,summary]", "task.parts=['inference', 'summary'] is not allowed"),
    ("task=inference setting=oracle_preference", "setting=oracle_preference is defined for generation only"),
    (f"tracking.uri={UNREACHABLE}", f"tracking.uri='{UNREACHABLE}' is not reachable within 3 s"),
    ("prompts.dir=/no/such/folder", "prompts.dir='/no/such/folder' is not a directory"),
    ("paths.output_root=/etc/hostname/outputs", "paths.output_root='/etc/hostname/outputs' is not a writable folder"),
    ("calls.cache_dir=/etc/hostname/cache", "calls.cache_dir='/etc/hostname/cache' is not a writable folder"),
    ("BAD_PROMPTS", "prompt evaluation/preference_inferrer asks for placeholder(s) ['user_name']"),
    # credentials in a URL: shown masked (tests/test_secrets.py checks nothing else shows them)
    ("evaluator.judge.api_base=http://u:pw-1@127.0.0.1:9/v1",
     "evaluator.judge.api_base='http://***@127.0.0.1:9/v1' carries credentials in the URL"),
    ("tracking.uri='https://127.0.0.1:9/?token=tok-123456'", "tracking.uri='https://127.0.0.1:9/?token=***' carries"),
]


@pytest.mark.parametrize("override,message", BAD_SETTINGS, ids=[b[0] for b in BAD_SETTINGS])
def test_each_bad_setting_is_one_line_before_any_call(tmp_path: Path, override: str, message: str) -> None:
    overrides = [f"prompts.dir={bad_prompts(tmp_path)}"] if override == "BAD_PROMPTS" else override.split()
    cfg = stub_config(UNREACHABLE, tmp_path, "tracking=mlflow", *overrides)
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        plan(cfg, tmp_path / "job")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert time.monotonic() - started < 10  # an unreachable server is found in seconds, not minutes


@pytest.mark.parametrize("override,message", [BAD_SETTINGS[i] for i in (0, 3, 15, 22, 23)],
                         ids=[BAD_SETTINGS[i][0] for i in (0, 3, 15, 22, 23)])
def test_the_cli_exits_2_in_one_line_without_a_traceback(tmp_path: Path, override: str, message: str) -> None:
    proc = run_job([sys.executable, "-m", "cupid_exp", *stub_overrides(UNREACHABLE), "runtime.progress=false",
                    f"paths.output_root={tmp_path / 'out'}", *override.split()], check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("cupid_exp: ")
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_no_valid_row_is_exit_2_not_an_empty_run(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", ["not a row", {"persona_id": 3}])
    with pytest.raises(DataError, match="has no valid row .2 bad rows; the first: rows.jsonl:1"):
        plan(stub_config(UNREACHABLE, tmp_path, "data=local", f"data.path={path}"), tmp_path / "job")


def test_an_oversized_instance_is_refused_before_it_is_sent_and_the_rest_run(tmp_path: Path) -> None:
    rows = make_rows(3)
    rows[1]["prior_interactions"][0]["dialogue"][1]["content"] = "lorem ipsum dolor " * 120_000  # ~2 MB
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    root = tmp_path / "out"
    with InProcessModel() as stub:
        proc = run_job(cli_command(stub, root, "tracking=none", "model.context_window=128000",
                                   "runtime.max_failed_fraction=0.5", data=data, cache_dir=tmp_path / "c"))
        received = stub.stats()["received"]
    assert received["infer"] == 2  # the oversized instance's prompt never reached the provider
    (job,) = job_dirs(root)
    records = {r["key"]: r for r in read_jsonl(job / "instances.jsonl")}
    big = records[f"{rows[1]['persona_id']}/{rows[1]['instance_type']}"]
    assert [(e["step"], e["kind"]) for e in big["errors"]] == [("infer", "context_length")]
    assert "not sent" in big["errors"][0]["message"] and "128,000-token context window" in big["errors"][0]["message"]
    assert sum(1 for r in records.values() if not r["errors"]) == 2
    metrics = json.loads((job / "metrics.json").read_text())["metrics"]
    assert metrics["calls/not_sent_oversized"] == 1 and metrics["calls/requests"] == metrics["calls/total"]
    assert "infer/context_length=1" in proc.stdout


# (overrides, the file the job sends): each choice that adds a prompt file to the job, and the base ones
NEEDED_PROMPTS = [
    ("", "evaluation/preference_inferrer.yaml"),
    ("", "evaluation/preference_matcher.yaml"),
    ("", "synthesis/preference_decomposer.yaml"),
    ("task=generation", "evaluation/response_generator.yaml"),
    ("task=generation", "evaluation/response_judger.yaml"),
    ("setting=summary", "evaluation/session_summarizer.yaml"),
    ("task=generation setting=oracle_preference", "evaluation/response_generator_oracle_preference.yaml"),
    ("evaluator=prefmatcher", "evaluation/preference_matcher_model.yaml"),
]


def official_folder_without(tmp_path: Path, missing: str) -> Path:
    """A prompt folder in the official layout (with the matcher's examples file) that lacks one file."""
    folder = full_prompt_folder(tmp_path / "official")
    (folder / "evaluation" / "preference_matcher_examples.yaml").write_text(
        (PROJECT_PROMPTS / "evaluation" / "preference_matcher_examples.yaml").read_text())
    (folder / missing).unlink()
    return folder


@pytest.mark.parametrize("overrides,missing", NEEDED_PROMPTS, ids=[f"{o or 'base'}:{m}" for o, m in NEEDED_PROMPTS])
def test_a_prompts_dir_lacking_a_file_the_job_sends_is_refused_naming_it(tmp_path: Path, overrides: str,
                                                                           missing: str) -> None:
    """Our file of the same name is never sent instead: the user asked for that folder's prompts."""
    folder = official_folder_without(tmp_path, missing)
    assert (PROJECT_PROMPTS / missing).is_file()  # a fallback was there to take
    cfg = stub_config(UNREACHABLE, tmp_path, f"prompts.dir={folder}", *overrides.split())
    with pytest.raises(ConfigError) as err:
        plan(cfg, tmp_path / "job")
    line = str(err.value)
    assert f"lacks {missing}," in line and str(folder) in line and "\n" not in line


def test_a_prompts_dir_lacking_a_file_the_job_does_not_send_is_fine(tmp_path: Path) -> None:
    folder = official_folder_without(tmp_path, "evaluation/session_summarizer.yaml")
    job = plan(stub_config(UNREACHABLE, tmp_path, f"prompts.dir={folder}", "calls.dry_run=true"), tmp_path / "job")
    assert job.work.kind.prompts.directory == folder.resolve()


def test_the_cli_refuses_a_prompts_dir_lacking_a_file_before_any_call(tmp_path: Path) -> None:
    folder = official_folder_without(tmp_path, "evaluation/preference_matcher.yaml")
    with InProcessModel() as stub:
        proc = run_job(cli_command(stub, tmp_path / "out", f"prompts.dir={folder}", "data.limit=1"), check=False)
        received = stub.stats()["total_received"]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert received == 0  # not one request: the shipped matcher prompt was not sent in its place
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cupid_exp: ") and "Traceback" not in proc.stderr
    assert "lacks evaluation/preference_matcher.yaml" in lines[0]
