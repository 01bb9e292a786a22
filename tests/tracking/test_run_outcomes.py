"""How a job's exception ends its MLflow run: the status and the outcome tags (``run_outcomes``); a job that got
through ends its run by its exit code (tests/job/test_outcomes.py and test_budget_cli.py run those through the CLI)."""

from __future__ import annotations

import errno

import pytest

from cupid_exp.durability.signals import Terminated
from cupid_exp.errors import first_line
from cupid_exp.llm.retry import FatalProviderError
from cupid_exp.outputs import EnvironmentFailure
from cupid_exp.run_outcomes import outcome_tags, stale_tags, status_of
from cupid_exp.tracking.mlflow import ends_on_error


class _Run:
    def __init__(self) -> None:
        self.ended: list[tuple] = []

    def end(self, status: str, summary=None, tags=None) -> None:
        self.ended.append((status, tags))


class _TryLater(Exception):
    outcome = "retry_later"  # how a stop names its own outcome


@pytest.mark.parametrize("exc, status, outcome, reason", [
    (FatalProviderError("gpt-4o", "auth", "401 invalid key", ("subject",)), "FAILED", "refused", "stopped: subject"),
    (EnvironmentFailure("/x/j.jsonl", OSError(errno.ENOSPC, "No space left on device")), "FAILED", "environment",
     "environment failure: /x/j.jsonl: No space left on device [ENOSPC]"),
    (_TryLater("rate limit: requests per day, retry in 3600 s"), "FAILED", "retry_later", "rate limit: requests per"),
    (TypeError("a bug\nwith more lines"), "FAILED", "error", "TypeError: a bug"),
    (KeyboardInterrupt(), "KILLED", "interrupted", "Ctrl-C"),
    (Terminated(), "KILLED", "interrupted", "SIGTERM"),
])
def test_an_exception_ends_the_run_with_its_outcome_and_reason(exc, status, outcome, reason) -> None:
    run = _Run()
    with pytest.raises(type(exc)):
        with ends_on_error(run):
            raise exc
    ((ended, tags),) = run.ended
    assert ended == status and tags["cupid.outcome"] == outcome
    assert tags["cupid.reason"].startswith(reason) and "\n" not in tags["cupid.reason"]
    assert tags["mlflow.note.content"] == f"{outcome}: {tags['cupid.reason']}"


def test_only_ok_is_finished_and_a_reopened_run_drops_what_the_attempt_before_said() -> None:
    assert [status_of(o) for o in ("ok", "incomplete", "budget", "interrupted")] == [
        "FINISHED", "FAILED", "FAILED", "KILLED"]
    assert outcome_tags("ok") == {"cupid.outcome": "ok"}
    before = outcome_tags("budget", "BUDGET: $0.0050 of $0.0050 spent")
    assert sorted(stale_tags(before)) == ["cupid.outcome", "cupid.reason", "mlflow.note.content"]
    assert stale_tags({**before, "mlflow.note.content": "the user's own description"}) == [
        "cupid.outcome", "cupid.reason"]


def test_a_run_that_cannot_be_ended_by_an_error_without_a_message_leaves_the_jobs_own_error(caplog) -> None:
    """``TimeoutError()`` has no message: reporting it must not raise (an ``IndexError`` in the handler would replace
    the job's own error, the one the user needs)."""
    class _Unreachable(_Run):
        def end(self, status: str, summary=None, tags=None) -> None:
            raise TimeoutError()

    with pytest.raises(ValueError, match="the job's own"):
        with ends_on_error(_Unreachable()):
            raise ValueError("the job's own")
    assert "could not be ended FAILED (TimeoutError: )" in caplog.text


@pytest.mark.parametrize("message, first", [("", ""), ("\n  \nsecond line\nthird", "second line"),
                                            ("x" * 300, "x" * 200)])
def test_first_line_of_any_message(message, first) -> None:
    assert first_line(OSError(message) if message else OSError()) == first
