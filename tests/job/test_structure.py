"""The lifecycle's shape, read from the source: ``job/`` is generic over the unit of work (it imports neither kind),
its modules import one another in one direction, each kind keeps only its own steps (no planning, lock, journal,
attempts or MLflow publishing of its own), and no module grows past 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "cupid_exp"
#: What only the lifecycle opens, locks, journals, budgets, reopens and publishes with.
LIFECYCLE = {"job_lock", "JobLock", "acquire", "Journal", "UsageLedger", "RunTracker", "open_run", "ends_on_error",
             "Claim", "run_key", "earlier_run", "attempt_tags", "job_budget", "open_attempt", "RunRequest", "FinalLog",
             "run_worker", "start_tracking", "job_identity", "config_digest", "check_keys", "missing_keys_line"}


def imported_names(path: Path) -> set[str]:
    """Every name ``path`` imports from cupid_exp."""
    return {alias.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)
            and node.module and node.module.startswith("cupid_exp") for alias in node.names}


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports from cupid_exp (type-checking imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cupid_exp"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("cupid_exp")}
    return found


def test_the_job_package_knows_no_kind_of_work_and_its_modules_import_one_way() -> None:
    modules = {f"cupid_exp.job.{p.stem}": imports(p) for p in (PACKAGE / "job").glob("*.py") if p.stem != "__init__"}
    for module, used in modules.items():
        assert not {u for u in used if u.startswith(("cupid_exp.evaluation", "cupid_exp.synthesis"))}, module
        back = [u for u in used if module in modules.get(u, ())]
        assert not back, f"{module} and {back} import each other"


def test_each_kind_keeps_only_its_own_steps() -> None:
    """No planning, lock, journal, ledger, budget, identity, key check or MLflow run of a kind's own."""
    for kind in ("evaluation", "synthesis"):
        for path in (PACKAGE / kind).rglob("*.py"):
            used = imported_names(path) & LIFECYCLE
            assert not used, f"{path.relative_to(PACKAGE)}: {sorted(used)}"


def test_no_module_of_the_lifecycle_or_its_kinds_is_over_400_lines() -> None:
    long = [f"{p.relative_to(PACKAGE)}: {n}" for folder in ("job", "evaluation", "synthesis")
            for p in (PACKAGE / folder).rglob("*.py") if (n := len(p.read_text().splitlines())) > 400]
    assert not long


def test_a_kind_of_work_is_a_frozen_description_and_four_verbs() -> None:
    """What the lifecycle reads of a kind is data fixed at load (``Work``); what it calls, four verbs (``Kind``); a
    kind's own state is frozen too (it travels to worker processes); and no class of the job holds over 15 fields."""
    from dataclasses import fields

    from cupid_exp.evaluation.work import EvaluationWork
    from cupid_exp.job.spec import Attempt, Job, JobSpec, Kind, Published, TrackingView, Work
    from cupid_exp.synthesis.work import SynthesisWork

    verbs = [name for name, value in vars(Kind).items() if callable(value) and not name.startswith("_")]
    assert verbs == ["connect", "run", "summarise", "publish"]
    for kind in (EvaluationWork, SynthesisWork):
        assert kind.__dataclass_params__.frozen, kind  # type: ignore[attr-defined]
        methods = {name for name, value in vars(kind).items() if callable(value) and not name.startswith("_")}
        assert methods == set(verbs), kind
    assert Work.__dataclass_params__.frozen and JobSpec.__dataclass_params__.frozen  # type: ignore[attr-defined]
    for cls in (Work, JobSpec, Attempt, Job, TrackingView, Published):
        assert len(fields(cls)) <= 15, cls
