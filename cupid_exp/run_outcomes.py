"""A job's ending as its MLflow run says it: FINISHED only for exit 0, else FAILED or KILLED with outcome tags."""

from __future__ import annotations

from typing import Mapping

from cupid_exp.errors import Terminated, first_line
from cupid_exp.outputs import environment_failure

OUTCOME_TAG = "cupid.outcome"
REASON_TAG = "cupid.reason"
DESCRIPTION_TAG = "mlflow.note.content"  #: MLflow's run description

#: An exception's outcome by its class name (this module imports none of them: it runs where MLflow is kept too).
_BY_CLASS = {"FatalProviderError": "refused", "InputError": "bad_input", "ConfigError": "bad_input",
             "DataError": "bad_input", "JobRunning": "bad_input", "BudgetExceeded": "budget"}


def status_of(outcome: str) -> str:
    """The MLflow status of an outcome: only ``ok`` is FINISHED."""
    return "FINISHED" if outcome == "ok" else "KILLED" if outcome == "interrupted" else "FAILED"


def description(outcome: str, reason: str) -> str:
    return f"{outcome}: {reason}" if reason else outcome


def outcome_tags(outcome: str, reason: str = "") -> dict[str, str]:
    """The tags a run ends with; an ``ok`` run gets no reason and no description."""
    tags = {OUTCOME_TAG: outcome}
    if outcome != "ok":
        tags.update({REASON_TAG: reason[:1000], DESCRIPTION_TAG: description(outcome, reason[:1000])})
    return tags


def stale_tags(tags: Mapping[str, str]) -> list[str]:
    """The outcome tags an earlier attempt left on a reopened run (the description only if it is ours)."""
    stale = [t for t in (OUTCOME_TAG, REASON_TAG) if t in tags]
    ours = description(tags.get(OUTCOME_TAG, ""), tags.get(REASON_TAG, ""))
    if tags.get(DESCRIPTION_TAG) and tags.get(DESCRIPTION_TAG) == ours:
        stale.append(DESCRIPTION_TAG)
    return stale


def outcome_of(exc: BaseException) -> tuple[str, str]:
    """(outcome, reason) of the exception that ended a job: its ``outcome``, its class's, or ``error``."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", "Ctrl-C"
    if isinstance(exc, Terminated):
        return "interrupted", exc.name
    first = first_line(exc, 1000)
    named = getattr(exc, "outcome", None)
    if isinstance(named, str) and named:
        # the job's exit 2 (``cupid_exp.entry.Outcome("error")``: a fatal refusal names it) is a refusal here;
        # "error" on a run means a bug
        return ("refused" if named == "error" else named), first
    if environment_failure(exc) is not None:
        return "environment", str(environment_failure(exc))
    kind = next((_BY_CLASS[c.__name__] for c in type(exc).__mro__ if c.__name__ in _BY_CLASS), None)
    if kind is not None:
        return kind, first
    return "error", f"{type(exc).__name__}: {first}" if first else type(exc).__name__
