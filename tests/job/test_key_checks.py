"""The real CLI with a role whose provider key is missing: one line naming the role, the model and the
variable, exit 2, and not one request sent, although the other roles' server is up and would have been
called first. A dry run calls nothing, so it warns in the same line and goes on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.cli_runner import cli_env, run_cli

from cupid_exp.testing.cupid_data import stub_overrides
from cupid_exp.testing.stub_llm_server import StubServer

KEY_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
LINE = ("model (claude37, anthropic/claude-3-7-sonnet-20250219) needs ANTHROPIC_API_KEY, which is not set; "
        "export it or point the role at another endpoint (model.api_base=URL, model.api_key_env=VAR)")


def env_without_keys(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in cli_env().items() if k not in KEY_VARS}, **extra}


def run(tmp_path: Path, url: str, *overrides: str, subject_at_stub: bool = True, matcher_at_stub: bool = True,
        **env: str) -> subprocess.CompletedProcess:
    """The CLI with every role at the stub but those the test names (its shipped config then stands)."""
    at_stub = [o for o in stub_overrides(url) if (subject_at_stub or not o.startswith("model"))
               and (matcher_at_stub or "evaluator.matcher" not in o)]
    return run_cli([sys.executable, "-m", "cupid_exp", *at_stub, "runtime.progress=false", "tracking=none",
                    f"paths.output_root={tmp_path / 'out'}", "data.limit=2", *overrides],
                   env=env_without_keys(**env), check=False)


def test_a_missing_evaluator_key_stops_before_the_subjects_first_call(tmp_path: Path) -> None:
    """The subject and decomposer are at the stub (no key needed); the matcher is the paper's GPT-4o. Without the
    check, the stub answers the subject's and decomposer's calls before the matcher's calls fail."""
    with StubServer() as stub:
        proc = run(tmp_path, stub.url, "llm@evaluator.matcher=gpt4o_eval", matcher_at_stub=False)
        received = stub.stats()["total_received"]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert received == 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "cupid_exp: evaluator.matcher (gpt4o_eval, openai/gpt-4o-2024-11-20) needs OPENAI_API_KEY, which is not "
        "set; export it or point the role at another endpoint (evaluator.matcher.api_base=URL, "
        "evaluator.matcher.api_key_env=VAR)")
    assert "Traceback" not in proc.stderr


def test_model_claude_without_its_key_is_one_line_and_exit_2(tmp_path: Path) -> None:
    secret = "sk-other-provider-VALUE-0123456789"
    with StubServer() as stub:
        proc = run(tmp_path, stub.url, "model=claude", subject_at_stub=False, COHERE_API_KEY=secret)
        received = stub.stats()["total_received"]
    assert proc.returncode == 2 and received == 0
    assert proc.stderr.strip().splitlines() == [f"cupid_exp: {LINE}"]
    assert secret not in proc.stderr + proc.stdout


def test_a_dry_run_warns_in_the_same_line_and_estimates(tmp_path: Path) -> None:
    with StubServer() as stub:
        proc = run(tmp_path, stub.url, "llm@evaluator.matcher=gpt4o_eval", "calls.dry_run=true",
                   matcher_at_stub=False)
        received = stub.stats()["total_received"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert received == 0 and "DRY RUN (no model was called)" in proc.stdout
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "a real run would stop here" in line]
    assert len(warnings) == 1 and "evaluator.matcher (gpt4o_eval, openai/gpt-4o-2024-11-20) needs OPENAI_API_KEY" \
        in warnings[0]


def test_with_the_key_exported_the_same_job_runs_and_its_resume_needs_none(tmp_path: Path) -> None:
    """The same matcher, its config untouched (no api_base), with OPENAI_API_KEY exported: the check passes and
    the job runs (OpenAI's own OPENAI_BASE_URL sends its calls to the stub instead of api.openai.com). The same
    command again without the key resumes with every instance finished: it calls nothing, so it needs no key."""
    with StubServer() as stub:
        first = run(tmp_path, stub.url, "llm@evaluator.matcher=gpt4o_eval", matcher_at_stub=False,
                    OPENAI_API_KEY="sk-test-0000000000", OPENAI_BASE_URL=stub.url)
        received = stub.stats()["received"]
        again = run(tmp_path, stub.url, "llm@evaluator.matcher=gpt4o_eval", matcher_at_stub=False)
        received_again = stub.stats()["received"]
    assert first.returncode == 0, first.stderr[-2000:]
    assert received.get("match", 0) > 0  # the matcher's calls reached the stub
    assert "complete: 2 of 2 instances" in first.stdout
    assert again.returncode == 0, again.stderr[-2000:]
    assert received_again == received and "2 of 2 instances already finished" in again.stdout + again.stderr
