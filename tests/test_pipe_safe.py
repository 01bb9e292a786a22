"""``errors.pipe_safe``: a reader that closed stdout (``| head``) ends the command quietly; any other broken pipe
is an error of its own and is raised."""

from __future__ import annotations

import io

import pytest

from cupid_exp import errors


class _ClosedStdout(io.StringIO):
    """stdout whose reader has gone: what is buffered cannot be flushed."""

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def _writes_to_a_closed_pipe() -> int:
    raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_stdout_ends_the_command_with_its_exit_code(monkeypatch) -> None:
    monkeypatch.setattr("sys.stdout", _ClosedStdout())
    assert errors.pipe_safe(_writes_to_a_closed_pipe) == errors.EXIT_CLOSED_PIPE


def test_a_broken_pipe_elsewhere_is_raised_while_stdout_is_fine(monkeypatch) -> None:
    monkeypatch.setattr("sys.stdout", io.StringIO())
    with pytest.raises(BrokenPipeError):
        errors.pipe_safe(_writes_to_a_closed_pipe)
