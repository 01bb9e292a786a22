"""Synthesis calls models through the same client: a role whose provider key is missing stops the job before
its first call, in one line naming the role (its override path), the model and the variable, exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

from helpers.cli_runner import cli_env, run_cli


def test_a_synthesis_role_without_its_key_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in cli_env().items() if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")}
    proc = run_cli([sys.executable, "-m", "cupid_exp.synthesize", "llm@synthesis.roles.session_writer=claude35",
                    "tracking=none", f"paths.output_root={tmp_path}"], env=env, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "cupid_exp.synthesize: synthesis.roles.session_writer (claude35, anthropic/claude-3-5-sonnet-20240620) needs "
        "ANTHROPIC_API_KEY, which is not set; export it or point the role at another endpoint "
        "(synthesis.roles.session_writer.api_base=URL, synthesis.roles.session_writer.api_key_env=VAR)"]
    assert not list(tmp_path.glob("synthesis/*/journeys/*.json"))  # no persona was started
