"""The matrix's modes: the real CLI against the stub as one job (``sync``), through the Batch API (``batch``), on two
worker processes (``workers``), as a joblib sweep of two jobs on different data (``sweep``), and as synthesis.

Every cell is small (2 instances a job, one persona), priced (a counted cost to hold against what the stub billed),
and carries sentinel secrets: a header on every role (``params.extra_headers``) and the endpoint's key in the
environment; neither may reach a file or a printed line."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from helpers.cli_runner import cli_command, cli_env

from cupid_exp.synthesis.config import ROLES as SYNTHESIS_ROLES
from cupid_exp.testing.cupid_data import make_rows, write_jsonl

MODES = ("sync", "batch", "workers", "sweep", "synthesis")
N = 2  # instances a job
IN, OUT, MAX_TOKENS = 1e-7, 2e-6, 600  # per token; a request's worst case is about $0.0014
EVAL_ROLES = ("model", "evaluator.decomposer", "evaluator.matcher", "evaluator.judge")
HEADER_SECRET = "hdr-faultmatrix-SENTINEL-51ce"
KEY_SECRET = "sk-faultmatrix-SENTINEL-7d2a90"
SECRETS = (HEADER_SECRET, KEY_SECRET)
BATCH = ("calls.batch=true", "calls.batch_delay_s=0.2", "calls.batch_poll_s=0.2")


def roles(mode: str) -> tuple[str, ...]:
    """The config nodes of the cell's model roles."""
    return tuple(f"synthesis.roles.{r}" for r in SYNTHESIS_ROLES) if mode == "synthesis" else EVAL_ROLES


def env() -> dict[str, str]:
    """The CLI's environment, the endpoint's key a sentinel (``api_key_env`` of ``openai_compatible``)."""
    return cli_env(OPENAI_COMPATIBLE_API_KEY=KEY_SECRET)


@dataclass
class Cell:
    """One cell's folders and data: ``root`` is the output root (journal, cache, store, job folders)."""

    mode: str
    tmp: Path
    data: list[Path] = field(default_factory=list)
    attempt: int = 0  # > 0: the cell again, its timed fault having missed (``drivers.FaultMissed``)

    @property
    def root(self) -> Path:
        return self.tmp / "out"

    @property
    def jobs(self) -> int:
        return 2 if self.mode == "sweep" else 1

    @property
    def instances(self) -> int:
        """Instances each job must end with: the data's, or one persona's three."""
        return 3 if self.mode == "synthesis" else N

    @property
    def program(self) -> str:
        return "cupid_exp.synthesize" if self.mode == "synthesis" else "cupid_exp"


def new_cell(mode: str, tmp: Path, attempt: int = 0) -> Cell:
    cell = Cell(mode, tmp, attempt=attempt)
    tmp.mkdir(parents=True, exist_ok=True)
    if mode != "synthesis":  # a sweep's two jobs on different instances: no request of one is the other's
        rows = make_rows(N * cell.jobs)
        cell.data = [write_jsonl(tmp / f"data{j}.jsonl", rows[N * j:N * (j + 1)]) for j in range(cell.jobs)]
    return cell


def _per_role(mode: str) -> list[str]:
    out = []
    for role in roles(mode):
        out += [f"{role}.model_info.input_cost_per_token={IN}", f"{role}.model_info.output_cost_per_token={OUT}",
                f"{role}.params.max_tokens={MAX_TOKENS}", f"+{role}.params.extra_headers={{X-Api-Key:{HEADER_SECRET}}}"]
    return out


def command(cell: Cell, url: str, *extra: str, tracking: bool = False, seed_store: bool = True) -> list[str]:
    """The cell's command against the stub at ``url``, ``extra`` last (a fault's overrides win). ``tracking``: the
    default SQLite store under the output root (pre-made unless ``seed_store`` is off), else ``tracking=none``."""
    track = [] if tracking else ["tracking=none"]
    if cell.mode == "synthesis":
        stub = []
        for role in roles(cell.mode):
            stub += [f"llm@{role}=openai_compatible", f"{role}.litellm_model=openai/stub", f"{role}.api_base={url}",
                     f"{role}.structured_output=true"]
        return [sys.executable, "-m", "cupid_exp.synthesize", "synthesis=offline", "synthesis.n_personas=1",
                "runtime.progress=false", f"paths.output_root={cell.root}", *stub, *_per_role(cell.mode), *track,
                *extra]
    cmd = cli_command(url, cell.root, *track, *_per_role(cell.mode), seed=tracking and seed_store)
    data = ["data=local", "data.path=" + ",".join(str(p) for p in cell.data)]
    if cell.mode == "sweep":
        return [*cmd[:3], "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *cmd[3:], *data, *extra]
    mode = {"batch": list(BATCH), "workers": ["runtime.workers=2"]}.get(cell.mode, [])
    return [*cmd, *data, *mode, *extra]
