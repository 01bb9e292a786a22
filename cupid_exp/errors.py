"""How a job ends: exit codes, ``Outcome``, the one-line errors. A leaf, so every layer can name them."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator

EXIT_OK, EXIT_BUG, EXIT_BAD_INPUT, EXIT_INCOMPLETE = 0, 1, 2, 3
EXIT_BUDGET = 4
EXIT_ENVIRONMENT = 5  #: a full disk, a read-only or forbidden path, a vanished folder (``outputs.environment_failure``)
EXIT_RETRY_LATER = 75  #: sysexits' EX_TEMPFAIL: a rate limit outlasts the patience (``cupid_exp.llm.retry.RetryLater``)
EXIT_INTERRUPTED = 130  #: Ctrl-C: 128 + SIGINT, what a shell reports for a process SIGINT ended
EXIT_TERMINATED = 143  #: SIGTERM (a scheduler's preemption, ``kill``): 128 + SIGTERM; other stop signals 128 + theirs
EXIT_CLOSED_PIPE = 141  #: 128 + SIGPIPE: the reader of the output went away (``--help | head``)


def pipe_safe(main: Callable[[], Any]) -> Any:
    """``main()``'s exit code; a closed stdout (``| head``) gives ``EXIT_CLOSED_PIPE`` without a traceback."""
    try:
        try:
            return main()
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        try:  # what a write to a closed stdout left in its buffer fails again; another pipe's error is not ours
            sys.stdout.flush()
        except BrokenPipeError:
            pass
        else:
            raise
        with contextlib.suppress(OSError, ValueError):  # what is still buffered goes nowhere, also at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE


def first_line(error: object, limit: int | None = 200) -> str:
    """An error's message (or any text) for a one-line report: its first non-blank line, stripped, cut to ``limit``
    ("" for an empty message, which ``OSError()`` or ``TimeoutError()`` have: indexing its lines would raise)."""
    return next((line.strip() for line in str(error).splitlines() if line.strip()), "")[:limit]


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then its cause (else its context), and so on, each once."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


@dataclass
class Outcome:
    """How a job ended: ``ok``, ``incomplete`` (too many failed instances), ``budget`` (its budget stopped it),
    ``environment``, ``retry_later`` (a rate limit outlasted the patience) or ``error`` (bad input)."""

    outcome: str
    reason: str = ""
    value: float | None = None  # what Hydra's sweepers optimise (the headline metric)

    @property
    def exit_code(self) -> int:
        return {"ok": EXIT_OK, "incomplete": EXIT_INCOMPLETE, "budget": EXIT_BUDGET, "environment": EXIT_ENVIRONMENT,
                "retry_later": EXIT_RETRY_LATER}.get(self.outcome, EXIT_BAD_INPUT)


class ConfigError(ValueError):
    """A value or combination of choices that cannot run; raised before any model call."""


class InputError(Exception):
    """Bad settings or data: reported in one line, exit 2 (``ConfigError``, ``DataError`` are turned into it)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or a stop signal (``signum``) during a job, with what its journal holds (``finished``; None: no journal);
    exit 128 + ``signum``. Still a KeyboardInterrupt, so runs end KILLED."""

    def __init__(self, finished: int | None = None, total: int | None = None, job: str | None = None,
                 noun: str = "instances", signum: int = signal.SIGINT):
        super().__init__(finished, total)
        self.finished, self.total, self.job, self.noun, self.signum = finished, total, job, noun, signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def line(self) -> str:
        by = "" if self.signum == signal.SIGINT else f" ({signal.Signals(self.signum).name})"
        where = f"interrupted{by}" + (f" in sweep job {self.job}" if self.job else "")
        if self.total is None:
            return f"{where}; run the same command to resume (the journal keeps what finished)"
        if self.finished is None:
            return (f"{where}: {self.total} {self.noun}, none journaled (runtime.resume=false); run the command again "
                    "to start over")
        return (f"{where}: {self.finished} of {self.total} {self.noun} finished and journaled; run the same command "
                "to resume")


class Terminated(SystemExit):
    """A stop signal: stop like Ctrl-C, exit 128 + its number; ``jobs``: what a joblib launcher's jobs raised."""

    def __init__(self, signum: int = signal.SIGTERM, jobs: tuple[Interrupted, ...] = ()) -> None:
        super().__init__(128 + signum)
        self.signum, self.jobs = signum, tuple(jobs)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name
