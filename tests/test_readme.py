"""Every command in README.md and docs/*.md runs here, so a command cannot rot unseen.

Each fenced ```bash block is split into commands (one per line; ``\\`` continuations and here-documents
joined; trailing ``# comments`` dropped), and each command must be declared in ``EXPECTED`` below, keyed by
its text (fields: ``Expect`` in tests/helpers/doc_commands.py): an undeclared command fails
``test_every_command_is_declared…``, and so does a declaration whose command left the docs. A block's
commands run in order, for real, from a working folder that is a scratch copy of the checkout (links to its
folders; ``outputs/`` of its own): a plain ``python -m cupid_exp`` (or ``.synthesize``) through the CLI's entry in
this process (``helpers.cli_runner.run_job``: its exit code and everything printed), any other command (the shell's
own, an environment changed, a server, another program) by ``bash -c``; with:

- API roles (``stub="eval"``) sent to the stub server (cupid_exp/testing/stub_llm_server.py) by appended overrides,
  as tests/test_design_card.py does; every provider's key variable set to a fake value;
- placeholders (``RUN_A``, ``RUN_B``, ``JOB_DIR``, ``SYNTH_DIR``) filled from real runs made here;
- the Hub and GPU paths expected to stop with their one-line errors (exit 2, one stderr line);
- cheaper variants only where the command needs minutes (``instead=``, with ``why=``), and a few named skips
  (the install and the test command themselves, which CI runs: .ci/run).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Callable

import pytest
from helpers.cli_runner import PROJECT_ROOT, cli_env, run_job, seed_store
from helpers.doc_commands import (
    DOCS,
    FAST,
    KEYS,
    LINKED,
    SAMPLE_FULL,
    Expect,
    Workspace,
    at_stub,
    blocks,
    key_of,
    run_command,
    split_commands,
)

from cupid_exp.testing.stub_llm_server import StubServer

HUB = "data=local"  # what the Hub's one-line error must offer instead
EXPECTED: dict[str, Expect] = {
    # README: Run the demo
    "python3 -m venv .venv && . .venv/bin/activate": Expect(skip="CI makes the fresh venv (.ci/run)"),
    "bash scripts/setup.sh": Expect(skip="CI runs it in a fresh clone (.ci/run), and this suite runs inside its "
                                         "result"),
    "python -m cupid_exp": Expect(instead="python -m cupid_exp calls.dry_run=true", stdout_has="DRY RUN",
                                  why="the demo's embedded model takes minutes on 2 busy cores; this checks its "
                                      "config, "
                                      "data and prompts, and tests/test_launchers.py (slow) runs the CLI on it"),
    "python -m pytest -q": Expect(skip="the suite itself (CI runs it: .ci/run)"),
    "LITELLM_LOCAL_MODEL_COST_MAP=True mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db": Expect(
        server=True, extra="--workers 1",
        why="one web worker instead of 4 (each imports MLflow's app), and no job runner (doc_commands._serve)"),
    # README: Evaluate a real model
    # no stub: a role pointed at an api_base (a proxy) is not held to its provider's variable; without the check the
    # call would go to the real provider, which this machine cannot reach (and the exit code would be 3, not 2)
    "env -u ANTHROPIC_API_KEY python -m cupid_exp model=claude": Expect(exit=2, one_line="ANTHROPIC_API_KEY"),
    "python -m cupid_exp model=gpt4o calls.max_cost_usd=5": Expect(stub="base", extra=FAST,
                                                                      stdout_has="complete: 1 of 1 instances"),
    "python -m cupid_exp model=gpt4o calls.max_cost_usd=8": Expect(stub="base", extra=FAST,
                                                                      stdout_has="complete: 1 of 1 instances"),
    "python -m cupid_exp model=gpt4o data=cupid calls.dry_run=true": Expect(exit=2, one_line=HUB),
    "python -m cupid_exp model=gpt4o data=cupid": Expect(exit=2, one_line=HUB),
    "python -m cupid_exp.report": Expect(stdout_has="gpt4o"),
    f"python -m cupid_exp model=gpt4o data=local data.path={SAMPLE_FULL} calls.dry_run=true": Expect(
        stub="eval", stdout_has="DRY RUN"),
    # README: Compose experiments
    "python -m cupid_exp data.limit=1": Expect(stub="eval", extra="tracking=none",
                                               stdout_has="complete: 1 of 1 instances"),
    "python -m cupid_exp -m model=local,local_gemma": Expect(stub="eval", extra=FAST),
    "python -m cupid_exp model=claude llm@evaluator.decomposer=claude35": Expect(stub="eval", extra=FAST),
    "python -m cupid_exp model=openai_compatible model.litellm_model=openai/my-model "
    "model.api_base=http://127.0.0.1:8000/v1": Expect(stub="eval", extra=FAST),
    "python -m cupid_exp.testing.stub_llm_server --port 8000": Expect(server=True),
    f"python -m cupid_exp data=local data.path={SAMPLE_FULL} data.instance_types=[changing]": Expect(
        stub="eval", extra=FAST, stdout_has="changing"),
    "python -m cupid_exp prompts.dir=/path/to/CUPID/prompts": Expect(exit=2, stub="eval", one_line="prompts.dir"),
    "python -m cupid_exp model=claude --cfg job": Expect(stdout_has="name: gpt4o"),
    "python -m cupid_exp -m task=inference,generation setting=standard,oracle,summary": Expect(stub="eval", extra=FAST),
    "python -m cupid_exp task=generation setting=oracle_preference": Expect(stub="eval", extra=FAST),
    "python -m cupid_exp task=both setting=summary": Expect(stub="eval", extra=FAST),
    "python -m cupid_exp -m setting=retrieval setting.retriever=bm25,embedding,recency": Expect(
        stub="eval", extra=FAST),
    "python -m cupid_exp model=gpt4o evaluator=prefmatcher evaluator.server.serve=true": Expect(
        exit=2, one_line="vllm"),
    # README: Presets
    "python -m cupid_exp -m +experiment=table1 calls.dry_run=true": Expect(exit=2, stderr_has=HUB),
    "python -m cupid_exp -m +experiment=table1": Expect(exit=2, stderr_has=HUB),
    "python -m cupid_exp.report --reference paper": Expect(stdout_has="paper: GPT-4o"),
    # docs/presets.md
    f"python -m cupid_exp -m +experiment=table1 calls.dry_run=true data=local data.path={SAMPLE_FULL}": Expect(
        check="dry_run_totals"),
    # README: Reports, comparisons and config diffs
    "python -m cupid_exp.report --filter \"params.\\`model.name\\` = 'gpt4o'\" --format csv --output leaderboard.csv":
        Expect(check="csv_of_gpt4o"),
    "python -m cupid_exp.report --format html --output report.html --plots report_plots/": Expect(
        check="html_and_plots"),
    "python -m cupid_exp.report --compare RUN_A RUN_B": Expect(short_ids=True, stdout_has="f1"),
    "python -m cupid_exp.diff JOB_DIR RUN_B": Expect(stdout_has="# verified"),
    # README: Comparing models
    "python -m cupid_exp -m model=gpt4o model.params.temperature=0,0.4 data.limit=1": Expect(stub="eval"),
    "python -m cupid_exp.report --subsets": Expect(stdout_has="| gpt4o · temperature=0.4 "),
    "python -m cupid_exp.diff RUN_A RUN_B --shell": Expect(stdout_has="python -m cupid_exp"),
    # README: Synthesis
    "python -m cupid_exp.synthesize synthesis.n_personas=2": Expect(
        stub="synth", stdout_has="personas: 2/2 completed", capture=("SYNTH_DIR", r"^outputs: (\S+)"),
        why="on the stub (seconds); the embedded model's run is the synthesis tests' (slow)"),
    "python -m cupid_exp data=local data.path=SYNTH_DIR/instances/instances.jsonl": Expect(
        stub="eval", extra=FAST, stdout_has="complete: 1 of 1 instances"),
    "python -m cupid_exp.synthesize synthesis=api synthesis.n_personas=10": Expect(
        stub="synth", extra="synthesis.n_personas=1", stdout_has="personas: 1/1 completed"),
    "python -m cupid_exp.synthesize llm@synthesis.roles.user_simulator=gpt4o_eval synthesis.max_turns=8": Expect(
        stub="synth", extra="synthesis.n_personas=1", stdout_has="personas: 1/1 completed"),
    # README: Extending
    "mkdir -p myconf/model && cat > myconf/model/my_model.yaml <<'YAML'": Expect(),
    "cupid-exp --config-dir myconf model=my_model": Expect(stub="eval", extra=FAST, stdout_has="model=my_model"),
    # docs/batch.md
    "python -m cupid_exp model=gpt4o calls.batch=true": Expect(
        stub="base", extra=f"{FAST} calls.batch_delay_s=0.1 calls.batch_poll_s=0.2", stdout_has="batches: "),
    "python -m cupid_exp -m +experiment=table1 calls.batch=true": Expect(exit=2, stderr_has=HUB),
    # how calls are sent is not the job's identity: after the command above this one would resume its journal
    # and send nothing; run afresh, it shows the judge kept live while the other roles batch
    "python -m cupid_exp model=gpt4o evaluator.judge.batch=false calls.batch=true": Expect(
        stub="base", extra=f"{FAST} calls.batch_delay_s=0.1 calls.batch_poll_s=0.2 runtime.resume=false",
        stdout_has="batches: "),
    # docs/performance.md
    "python bench/bench.py --quick": Expect(instead="python bench/bench.py --help",
                                            why="minutes of benchmark; its figures are dated measurements"),
    # docs/scale-out.md
    "python -m cupid_exp -m hydra/launcher=joblib hydra.launcher.n_jobs=4 model=gpt4o,claude37,deepseek_r1,qwen72b "
    "evaluator=gpt4o data=cupid": Expect(exit=2, stderr_has=HUB),
    "python -m cupid_exp -m hydra/launcher=submitit_slurm hydra.launcher.partition=cpu hydra.launcher.timeout_min=600 "
    "hydra.launcher.cpus_per_task=4 hydra.launcher.mem_gb=16 hydra.launcher.array_parallelism=8 "
    "tracking.uri=http://mlflow.internal:5000 calls.cache_dir=/shared/cupid-cache model=gpt4o,claude37,deepseek_r1 "
    "setting=standard,oracle,summary evaluator=gpt4o data=cupid": Expect(
        skip="needs a SLURM cluster; the same submitit path runs locally in tests/test_launchers.py"),
    # docs/team-server.md
    "LITELLM_LOCAL_MODEL_COST_MAP=True mlflow server --host 0.0.0.0 --port 5000 --backend-store-uri "
    "sqlite:////srv/mlflow/mlflow.db --artifacts-destination /srv/mlflow/artifacts": Expect(
        server=True, extra="--workers 1",
        why="one web worker instead of 4 (each imports MLflow's app), and no job runner (doc_commands._serve)"),
    "export MLFLOW_TRACKING_URI=http://mlflow.internal:5000": Expect(),
    "python -m cupid_exp model=gpt4o evaluator=gpt4o data=cupid": Expect(exit=2, one_line=HUB),
}

# Declarations whose behaviour lands with another branch of issue 24 (the lead removes this list after merging).
# ---------------------------------------------------------------- reading the docs
BLOCKS = blocks()


def test_every_command_is_declared_and_every_declaration_is_in_the_docs() -> None:
    in_docs = {key_of(c) for _, cmds in BLOCKS for c in cmds}
    undeclared = sorted(in_docs - set(EXPECTED))
    assert not undeclared, f"declare the expected outcome of these commands in tests/test_readme.py: {undeclared}"
    stale = sorted(set(EXPECTED) - in_docs)
    assert not stale, f"these declarations name commands no longer in the docs: {stale}"
    skipped = [k for k, e in EXPECTED.items() if e.skip]
    assert len(skipped) <= 4, skipped  # skips stay few and named


def test_the_splitter_joins_continuations_keeps_heredocs_and_drops_comments() -> None:
    block = ("# a comment line\npython -m a x=1 \\\n    y=2   # why\n\ncat > f <<'YAML'\nk: v  # kept\nYAML\n"
             "echo \"a # b\" 'c # d' # gone\n")
    assert split_commands(block) == ["python -m a x=1 y=2", "cat > f <<'YAML'\nk: v  # kept\nYAML",
                                     "echo \"a # b\" 'c # d'"]


# Paths and dotted names the docs mention must exist (they rot first when code moves).
NOT_IN_A_CHECKOUT = {"conf/local/default.yaml"}  # git-ignored: each user's own


def test_every_file_and_python_name_the_docs_mention_exists() -> None:
    import importlib

    missing = []
    for doc in DOCS:
        for ref in re.findall(r"`([^`\n]+)`", doc.read_text(encoding="utf-8")):
            for token in re.findall(r"(?<![\w/.<])((?:cupid_exp|tests|bench|conf|scripts|docs|prompts)"
                                    r"(?:[./][\w\-]+)+)", ref):
                if "/" in token:
                    if not (PROJECT_ROOT / token).exists() and token not in NOT_IN_A_CHECKOUT:
                        missing.append(f"{doc.name}: {token}")
                elif token.startswith("cupid_exp."):
                    parts, obj = token.split("."), None
                    for cut in range(len(parts), 0, -1):
                        try:
                            obj = importlib.import_module(".".join(parts[:cut]))
                        except ImportError:
                            continue
                        for attr in parts[cut:]:
                            obj = getattr(obj, attr, None)
                        break
                    if obj is None:
                        missing.append(f"{doc.name}: {token}")
    assert not missing, missing


def test_every_relative_link_resolves() -> None:
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            if not (doc.parent / target).exists():
                broken.append(f"{doc.name}: {target}")
    assert not broken, broken


# ---------------------------------------------------------------- running them

@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("readme")
    for name in LINKED:
        (root / name).symlink_to(PROJECT_ROOT / name)
    seed_store(root / "outputs")
    pythonpath = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = cli_env(**KEYS, PYTHONPATH=pythonpath, XDG_CACHE_HOME=str(root / ".cache"))
    with StubServer() as stub:
        yield Workspace(root, stub, env)


@pytest.fixture(scope="module")
def runs(workspace: Workspace) -> dict[str, str]:
    """Two finished, tracked jobs in the workspace's MLflow store (gpt4o and claude on the stub), for the report
    and diff commands: RUN_A, RUN_B (their run ids) and JOB_DIR (A's folder)."""
    cmd = [sys.executable, "-m", "cupid_exp", "-m", "model=gpt4o,claude", *at_stub(workspace.stub.url)]
    proc = run_job(cmd, env=workspace.env, check=False, park=False, cwd=workspace.root)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    ids = re.findall(r"\| MLflow run ([0-9a-f]{32}) at", proc.stdout)  # the outputs line (not the opening log line)
    dirs = re.findall(r"^outputs: (\S+) \|", proc.stdout, re.M)
    assert len(ids) == 2 and len(dirs) == 2, proc.stdout[-2000:]
    return {"RUN_A": ids[0], "RUN_B": ids[1], "JOB_DIR": dirs[0]}


def _doc_table(doc: str, title_row: str) -> dict[str, list[str]]:
    """Rows of the table in ``doc`` whose header starts with ``title_row``, keyed by their first cell."""
    text = (PROJECT_ROOT / doc).read_text(encoding="utf-8")
    start = text.index(title_row)
    rows = {}
    for line in text[start:].split("\n")[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def check_dry_run_totals(proc: subprocess.CompletedProcess, ws: Workspace) -> None:
    """docs/presets.md's dry-run table quotes what this command prints (table1's row)."""
    m = re.search(r"DRY RUN sweep total over \d+ jobs: (\d+) calls, (\d+) prompt tokens, ~(\d+) completion tokens, "
                  r"~\$([\d.]+)", proc.stdout)
    assert m, proc.stdout[-2000:]
    calls, prompt, completion, cost = m.groups()
    row = _doc_table("docs/presets.md", "| preset | calls | prompt tokens")["table1"]
    redo = ("docs/presets.md's dry-run table is stale: rerun its command for table1, table3, table9_10 and table11, "
            f"and quote the new totals with the date; table1 now: {m.group(0)}, docs: {row}")
    assert [c.replace(",", "") for c in row[:3]] == [calls, prompt, completion], redo
    assert row[3] == f"${float(cost):.2f}", redo


def check_csv_of_gpt4o(proc: subprocess.CompletedProcess, ws: Workspace) -> None:
    text = (ws.root / "leaderboard.csv").read_text(encoding="utf-8")
    assert "gpt4o" in text and "claude37" not in text, text[:1000]


def check_html_and_plots(proc: subprocess.CompletedProcess, ws: Workspace) -> None:
    assert "<table" in (ws.root / "report.html").read_text(encoding="utf-8")
    assert list((ws.root / "report_plots").glob("*.png"))


CHECKS: dict[str, Callable[[subprocess.CompletedProcess, Workspace], None]] = {
    "dry_run_totals": check_dry_run_totals, "csv_of_gpt4o": check_csv_of_gpt4o, "html_and_plots": check_html_and_plots}


def _needs_runs(commands: list[str]) -> bool:
    return any(re.search(r"\b(RUN_A|RUN_B|JOB_DIR)\b", c) or key_of(c).startswith("python -m cupid_exp.report")
               for c in commands)


def _block_params():
    """A block each (``slow`` where a command is)."""
    params = []
    for where, commands in BLOCKS:
        marks = [pytest.mark.slow] if any(EXPECTED.get(key_of(c), Expect()).slow for c in commands) else []
        params.append(pytest.param(commands, id=where, marks=marks))
    return params


@pytest.mark.parametrize("commands", _block_params())
def test_docs_block_runs_as_declared(commands: list[str], workspace: Workspace, request: pytest.FixtureRequest) -> None:
    values: dict[str, str] = {}
    if _needs_runs(commands):
        values.update(request.getfixturevalue("runs"))
    failures = []
    for command in commands:  # every command runs, so that one failure does not hide the next
        expect = EXPECTED.get(key_of(command))
        if expect is None:
            failures.append(f"undeclared command: {key_of(command)!r}: declare its outcome in EXPECTED")
            continue
        if expect.skip:
            continue
        try:
            run_command(command, expect, workspace, values, CHECKS)
        except AssertionError as exc:
            failures.append(f"{key_of(command)}: {exc}")
    assert not failures, "\n\n".join(failures)
