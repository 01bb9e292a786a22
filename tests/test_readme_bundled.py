"""The README's offline commands on the bundled model, verbatim: each does what the README says beside it.

tests/test_readme.py runs every documented command against the stub server, which answers every step well;
only the embedded SmolLM2-135M shows whether a command's steps fit the model (a summary cut at ``max_tokens``,
a judge that loops until it). These run the commands as given, on the CPU, in one workspace whose response cache
they share (a command's calls that an earlier command made are served from it), and each must end with every
instance complete. They run in this process as tests/test_readme.py runs the documented commands (``run_job``: the
same entry, exit code and printed lines): the process is not what they check, and one process loads the model once
and keeps llama.cpp's prompt cache (the matcher's few-shot prompt) from one command to the next. Slow: minutes on
2 cores.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.cli_runner import PROJECT_ROOT, cli_env, run_job, seed_store
from helpers.doc_commands import LINKED, SAMPLE_FULL, in_process_argv, key_of

from cupid_exp.llm.local import local_models

pytestmark = pytest.mark.slow

# The README's commands that run offline on the bundled model, each with the jobs it runs. Ordered so that the
# sweep's jobs fill the response cache the single jobs after it read.
OFFLINE = {
    "python -m cupid_exp -m task=inference,generation setting=standard,oracle,summary": 6,
    "python -m cupid_exp task=both setting=summary": 1,
    "python -m cupid_exp": 1,
    "python -m cupid_exp data.limit=1": 1,
    "python -m cupid_exp task=generation setting=oracle_preference": 1,
    "python -m cupid_exp -m setting=retrieval setting.retriever=bm25,embedding,recency": 3,
    f"python -m cupid_exp data=local data.path={SAMPLE_FULL} data.instance_types=[changing]": 1,
}


def test_the_offline_commands_are_the_readmes() -> None:
    text = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    commands = {key_of(re.sub(r"\s+#.*$", "", line)) for line in text.splitlines() if line.startswith("python -m")}
    assert set(OFFLINE) <= commands, sorted(set(OFFLINE) - commands)


def _fails(command: str, workspace: Path) -> str | None:
    """What went wrong with ``command`` run in ``workspace`` (None: it exited 0, each job with every instance)."""
    argv = in_process_argv(command)
    assert argv is not None, f"{command}: not a command run_job runs"
    proc = run_job(argv, env=cli_env(), check=False, cwd=workspace)
    said = f"\n$ {command}\nexit {proc.returncode}\nstdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}"
    done = re.findall(r"^complete: (\d+) of (\d+) instances ran without a failed step$", proc.stdout, re.M)
    ok = proc.returncode == 0 and len(done) == OFFLINE[command] and all(a == b and int(a) > 0 for a, b in done)
    return None if ok else said


@pytest.mark.longest
def test_the_offline_commands_complete_on_the_bundled_model(tmp_path: Path) -> None:
    """One test, the commands in order in one workspace (their shared response cache): a worker runs them all, and
    every command runs even when an earlier one failed, each failure said with its output."""
    for name in LINKED:
        (tmp_path / name).symlink_to(PROJECT_ROOT / name)
    seed_store(tmp_path / "outputs")
    try:
        failed = [said for said in (_fails(command, tmp_path) for command in OFFLINE) if said]
    finally:
        local_models().close()  # the model's ~1 GB is not kept for the worker's later tests
    assert not failed, "".join(failed)
