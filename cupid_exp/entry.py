"""The Hydra entry of ``python -m cupid_exp`` and ``python -m cupid_exp.synthesize``: a job's ``Outcome`` becomes the
README's exit codes, one line and no traceback but for a bug; a sweep runs every job and exits with the worst."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import traceback
import warnings
from pathlib import Path
from typing import Callable, Mapping, Sequence

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cupid_exp.config import moved_key
from cupid_exp.config_store import register_configs
from cupid_exp.durability.signals import Terminated, install_sigterm_handler, sweep_executor
from cupid_exp.errors import (
    EXIT_BAD_INPUT,
    EXIT_BUDGET,
    EXIT_BUG,
    EXIT_ENVIRONMENT,
    EXIT_INCOMPLETE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RETRY_LATER,
    InputError,
    Interrupted,
    Outcome,
    causes,
    first_line,
    pipe_safe,
)
from cupid_exp.hydra_errors import HeldStderr, ScrubbedStderr, hydra_text, one_line, unread_override
from cupid_exp.outputs import environment_failure, writing
from cupid_exp.resources import conf_dir
from cupid_exp.secrets import mask_url_credentials, scrub, scrub_file, scrub_obj, secret_values
from cupid_exp.tracking.callbacks import STATUS_FILE, job_statuses, reason_reported
from cupid_exp.tracking.mlflow import SweepParent
from cupid_exp.tracking.store_errors import TrackingUnavailable, store_unreachable

# A sweep exits with its worst job's code, worst first: what needs a fix (a bad setting, the environment, a budget),
# then what needs only time (a rate limit), then incomplete.
_SWEEP_SEVERITY = (EXIT_BAD_INPUT, EXIT_ENVIRONMENT, EXIT_BUDGET, EXIT_RETRY_LATER, EXIT_INCOMPLETE)


def _masked(line: str, overrides: Sequence[str], cfg: DictConfig | None = None) -> str:
    """An error line without any secret of the overrides or the config: Hydra's refusals quote the override."""
    config = [] if cfg is None else [OmegaConf.to_container(cfg, resolve=False)]
    return mask_url_credentials(scrub(line, secret_values([*overrides, *config])))


_STARTED = False  # set once a job function runs: a composition error before it is Hydra's own
_HELD = None  # stderr held until a job starts (``hydra_errors.HeldStderr``): Hydra's composition errors in one line
_SWEEP_DIR: Path | None = None  # a sweep's folder once it starts: a job's refused composition leaves its multirun.yaml


def _release_stderr(*, sweep: bool = False, replay: bool = True) -> None:
    """The real stderr back, with what was held unless not to ``replay`` it; in a ``sweep`` it stays scrubbed of the
    command line's secrets."""
    global _HELD
    if _HELD is not None:
        _HELD.release(replay=replay, clean=lambda text: _masked(text, sys.argv[1:]))
        _HELD = None
        if sweep:
            secrets = [s for s in secret_values(sys.argv[1:]) if s not in set(secret_values())]
            if secrets:
                sys.stderr = ScrubbedStderr(sys.stderr, lambda text: mask_url_credentials(scrub(text, secrets)))


def run_job_entry(cfg: DictConfig, program: str, job: Callable[[DictConfig, Path, dict, SweepParent | None], Outcome],
                  input_errors: tuple[type[BaseException], ...]) -> float | None:
    """Run one job under Hydra; write its status; exit with its code when it is a single run."""
    global _STARTED
    _STARTED = True
    _release_stderr()
    _quiet_interrupted_calls()
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    output_dir = Path(hc.runtime.output_dir)
    name, status_dir = _sweep_job(hc, output_dir) if multirun else (output_dir.name, output_dir)
    room = _keep_room(status_dir) if multirun else None
    try:  # a job that ends on a bug or Ctrl-C leaves no room behind
        try:
            # a sweep's job names its parent run by the sweep's folder: the run worker opens it while the first job
            # starts (``tracking.callbacks.MlflowSweepCallback``)
            parent = SweepParent(str(Path(hc.sweep.dir).resolve())) if multirun else None
            outcome = job(cfg, output_dir, dict(hc.runtime.choices), parent)
        except (*input_errors, InputError) as exc:
            line = _masked(str(exc), hc.overrides.task, cfg)
            _refused(f"{program}: {line}", line, Path(hc.sweep.dir) if multirun else None)
            outcome = Outcome(getattr(exc, "outcome", "error"), line)  # a provider's stop may say "retry_later"
        except (KeyboardInterrupt, Terminated) as exc:
            if not multirun:
                raise
            if not isinstance(exc, Interrupted):
                raise Interrupted(job=name, signum=getattr(exc, "signum", signal.SIGINT)) from exc
            exc.job = name
            raise
        except Exception as exc:  # noqa: BLE001 - a bug goes on with its traceback; the environment's is one line
            failure = environment_failure(exc) or _store_failure(exc, cfg)
            if failure is None:
                raise
            line = _masked(str(failure), hc.overrides.task, cfg)
            print(f"{program}: {line}", file=sys.stderr)
            outcome = Outcome("environment", line)
    except BaseException:
        if room is not None:
            room.unlink(missing_ok=True)
        raise
    if multirun:
        status = {"job": name, "folder": str(output_dir), "overrides": list(hc.overrides.task),
                  "outcome": outcome.outcome, "reason": outcome.reason}
        _write_status(status_dir / STATUS_FILE, json.dumps(scrub_obj(status, secret_values(status["overrides"]))),
                      room)
        return outcome.value
    if outcome.exit_code:
        sys.exit(outcome.exit_code)
    return outcome.value


def _sweep_job(hc: DictConfig, output_dir: Path) -> tuple[str, Path]:
    """A sweep job's name and status folder, so the sweep's folder lists every job."""
    sweep = Path(hc.sweep.dir).resolve()
    if output_dir.resolve().parent == sweep:
        return output_dir.name, output_dir
    name = f"{hc.job.num}_{output_dir.parent.name}"
    return name, sweep / name


_ROOM_BYTES = 64 * 1024  #: kept for a sweep job's status file: its overrides and its reason, many times over


def _keep_room(output_dir: Path) -> Path | None:
    """Reserve room for a sweep job's status file, so a full disk still gets it; None if already too full."""
    room = output_dir / ".job_status.room"
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        with room.open("wb") as fh:
            fh.write(bytes(_ROOM_BYTES))
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        room.unlink(missing_ok=True)
        return None
    return room


def _write_status(path: Path, text: str, room: Path | None) -> None:
    """The job's status, in the room kept for it (``_keep_room``) when the disk is full."""
    try:
        with writing(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            if room is not None:
                room.unlink(missing_ok=True)  # freed first: its blocks are what the status needs on a full disk
            path.write_text(text)
    finally:
        if room is not None:
            room.unlink(missing_ok=True)


def _store_failure(exc: Exception, cfg: DictConfig) -> Exception | None:
    """A tracking store that could not be reached, as the environment's failure (results stay in the journal)."""
    if not store_unreachable(exc) or not _raised_in_tracking(exc):
        return None
    first = first_line(exc)
    uri = cfg.get("tracking", {}).get("uri", "?")
    return TrackingUnavailable(f"the MLflow store at {uri} did not take this job's results ({type(exc).__name__}: "
                               f"{first}); the results are in the job's folder and its journal: run the same command "
                               "again once the store answers, and it publishes them")


def _raised_in_tracking(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) came from MLflow or our tracking, not e.g. a tokenizer's download."""
    paths = (frame.f_code.co_filename.replace("\\", "/") for link in causes(exc)
             for frame, _ in traceback.walk_tb(link.__traceback__))
    return any("/mlflow/" in path or "/cupid_exp/tracking/" in path for path in paths)


def _refused(line: str, reason: str, sweep_dir: Path | None) -> None:
    """Log why a job was refused; on the console only if no earlier job of the sweep was refused for the same reason."""
    from cupid_exp.job.publish import in_job_log

    in_job_log(line, logging.ERROR)
    if sweep_dir is None or not reason_reported(sweep_dir, reason):
        print(line, file=sys.stderr)


#: how the sweep's summary says each way a job ended
_ENDED = {"error": "refused", "incomplete": "incomplete", "budget": "stopped by a budget",
          "environment": "failed by the environment"}
_NAMED = 3  # jobs a group names before "and N more"


def grouped_outcomes(bad: list[Mapping[str, object]]) -> list[str]:
    """One line per (outcome, reason): '20 jobs refused (0_a, 1_b, 2_c and 17 more): data=cupid: …'."""
    groups: dict[tuple[str, str], list[str]] = {}
    for status in bad:
        groups.setdefault((str(status.get("outcome")), str(status.get("reason"))), []).append(str(status.get("job")))
    lines = []
    for (outcome, reason), jobs in groups.items():
        ended = _ENDED.get(outcome, outcome)
        if len(jobs) == 1:
            lines.append(f"  {jobs[0]}: {ended}: {reason}")
            continue
        more = f" and {len(jobs) - _NAMED} more" if len(jobs) > _NAMED else ""
        lines.append(f"  {len(jobs)} jobs {ended} ({', '.join(jobs[:_NAMED])}{more}): {reason}")
    return lines


class SweepDoesNotCompose(BaseException):
    """A sweep's job whose overrides do not compose (a BaseException: Hydra turns a callback's Exception into a
    warning and goes on)."""


class SweepComposesCallback(Callback):
    """Composes each job of a sweep before the sweep's other callbacks start anything (the MLflow store, its parent
    run, stderr live): Hydra's sweeper composes them only after, so one bad override left a half-made store and a
    message of many lines. One composition a job more; a sweeper other than Hydra's basic one is not checked."""

    def on_multirun_start(self, config: DictConfig, **kwargs: object) -> None:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.override_parser.overrides_parser import OverridesParser

        if OmegaConf.select(config, "hydra.sweeper._target_") != f"{BasicSweeper.__module__}.BasicSweeper":
            return
        loader = GlobalHydra.instance().config_loader()
        params = OmegaConf.select(config, "hydra.sweeper.params") or {}
        arguments = [*(f"{key}={value}" for key, value in params.items()), *config.hydra.overrides.task]
        try:
            overrides = OverridesParser.create(config_loader=loader).parse_overrides(arguments)
            for batch in BasicSweeper.split_arguments(overrides, None):
                for job in batch:
                    loader.load_sweep_config(config, list(job))
        except (HydraException, OmegaConfBaseException) as exc:
            raise SweepDoesNotCompose() from exc


class SweepReportCallback(Callback):
    """At a sweep's end: list failed or incomplete jobs, grouped by reason, and set the exit code."""

    exit_code = EXIT_OK

    def on_multirun_start(self, config: DictConfig, **kwargs: object) -> None:
        global _SWEEP_DIR
        try:  # a folder the sweep cannot make (a read-only output root): Hydra's error, held, said in one line
            Path(config.hydra.sweep.dir).mkdir(parents=True, exist_ok=True)
        except OSError:
            return
        _SWEEP_DIR = Path(config.hydra.sweep.dir)
        # the sweep composed: what it says from here on is said as it happens (joblib jobs too)
        _release_stderr(sweep=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: object) -> None:
        statuses = job_statuses(Path(config.hydra.sweep.dir))
        bad = [s for s in statuses if s.get("outcome") != "ok"]
        if not bad:
            return
        lines = [f"sweep: {len(bad)} of {len(statuses)} jobs did not complete:", *grouped_outcomes(bad)]
        print("\n".join(lines), file=sys.stderr)
        codes = [Outcome(s.get("outcome", "error")).exit_code for s in bad]
        SweepReportCallback.exit_code = next((c for c in _SWEEP_SEVERITY if c in codes), max(codes))


_PROGRAMS = {"config": "cupid_exp", "synthesize": "cupid_exp.synthesize"}  # how a one-line error names the command


def hydra_entry(config_name: str, task: Callable[[DictConfig], object],
                register: Callable[[], None] | None = None) -> Callable[[], None]:
    """A console-script ``main()`` running ``task`` under Hydra; composition errors exit 2, a sweep its worst code."""
    register_configs()
    program = _PROGRAMS.get(config_name, config_name)
    if register is not None:
        register()
    hydra_main = hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name=config_name)(task)

    def run() -> int:
        global _HELD
        _quiet_interrupted_calls()
        # loky's resource tracker (a process of its own, writing to our stderr) warns of the semaphores that a
        # sweep's workers, stopped by force once every job has returned (``_release_sweep_workers``), left for it
        # to clean up: it cleans them, and its warning came after the sweep's last line; multiprocessing's does the
        # same once a job is killed (kill -9), after the job's end
        _quiet_in_children("ignore::UserWarning:joblib.externals.loky.backend.resource_tracker")
        _quiet_in_children("ignore::UserWarning:multiprocessing.resource_tracker")
        # a log line that cannot be written (the job's log file on a full disk) is dropped, not printed as a
        # "--- Logging error ---" traceback: the write that fails in our own files is reported, in one line
        logging.raiseExceptions = False
        if os.environ.get("HYDRA_FULL_ERROR") != "1":
            _HELD = sys.stderr = HeldStderr(sys.stderr)
        install_sigterm_handler()  # a stop signal at any instant unwinds, and says so, as Ctrl-C does
        try:
            hydra_main()
        except Terminated as exc:  # outside a job (a job turns it into ``Interrupted``), or a joblib sweep's jobs'
            for line in [job.line() for job in exc.jobs] or [Interrupted(signum=exc.signum).line()]:
                print(line, file=sys.stderr, flush=True)
            return exc.code
        except SystemExit as exc:
            if exc.code == EXIT_BUG and not _STARTED:  # no job ran, no call was made
                # Hydra could not make the job's folder (a read-only output root): Hydra printed the error it caught
                failure = environment_failure(exc.__context__) if exc.__context__ is not None else None
                if failure is not None:
                    _release_stderr(replay=False)
                    print(f"{program}: {failure}", file=sys.stderr)
                    return EXIT_ENVIRONMENT
                if _SWEEP_DIR is not None:  # the sweeper saved the overrides before composing its jobs
                    scrub_file(_SWEEP_DIR / "multirun.yaml", secret_values(sys.argv[1:]))
                said = unread_override(sys.argv[1:], config_name) or (
                    one_line(_HELD.text, moved_key) if _HELD is not None else None)
                if said is not None:
                    _release_stderr(replay=False)  # none held in a sweep's composition: Hydra said it as it happened
                    print(f"{program}: {_masked(said, sys.argv[1:])}", file=sys.stderr)
                return EXIT_BAD_INPUT
            return exit_code_of(exc)
        except SweepDoesNotCompose as exc:  # no job ran, nothing was made
            if _HELD is None:  # HYDRA_FULL_ERROR=1
                traceback.print_exception(exc.__cause__)
                return EXIT_BAD_INPUT
            _release_stderr(replay=False)
            said = unread_override(sys.argv[1:], config_name) or one_line(hydra_text(exc.__cause__), moved_key)
            print(f"{program}: {_masked(said or str(exc.__cause__), sys.argv[1:])}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except KeyboardInterrupt as exc:  # Ctrl-C: the journal and the runs are closed by now; no traceback
            if not isinstance(exc, Interrupted):
                exc = Interrupted()
            print(exc.line(), file=sys.stderr, flush=True)
            return exc.exit_code
        except (HydraException, OmegaConfBaseException):  # HYDRA_FULL_ERROR=1: Hydra raised it, with its trace
            if _STARTED:
                raise
            traceback.print_exc()
            return EXIT_BAD_INPUT
        finally:
            _release_stderr()
        return SweepReportCallback.exit_code

    def main() -> None:
        try:
            exit_now(pipe_safe(run))
        except KeyboardInterrupt:  # a second Ctrl-C while the process ends: it was ending anyway
            os._exit(EXIT_INTERRUPTED)
        except Terminated as exc:  # the same for a second stop signal
            os._exit(exc.code)

    main.run = run  # type: ignore[attr-defined]  # the command's exit code, the process kept (tests run it in theirs)
    return main


def reset_entry() -> None:
    """Forget the last command's state, so that ``main.run()`` can run another in this process."""
    global _STARTED, _HELD, _SWEEP_DIR
    _STARTED, _HELD, _SWEEP_DIR = False, None, None
    SweepReportCallback.exit_code = EXIT_OK


def _quiet_interrupted_calls() -> None:
    """Silence "never awaited" for provider coroutines an interrupt or timeout dropped unstarted: no bug of ours."""
    warnings.filterwarnings("ignore", message=r"coroutine '\w+\.a(completion|\w+_batch|\w*file\w*)' was never awaited",
                            category=RuntimeWarning)


def _quiet_in_children(rule: str) -> None:
    """A warnings filter for child processes (``PYTHONWARNINGS``), after any the user set."""
    rules = [r for r in os.environ.get("PYTHONWARNINGS", "").split(",") if r]
    if rule not in rules:
        os.environ["PYTHONWARNINGS"] = ",".join([*rules, rule])


def exit_code_of(exc: SystemExit) -> int:
    """``sys.exit``'s argument as a process exit code (a message is printed, as Python would)."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def exit_now(code: int) -> None:
    """End the process without tearing down every object (threads joined, atexit run, streams flushed first)."""
    _release_sweep_workers()
    # what the interpreter does first: threading's own exit hooks (they stop e.g. joblib's executor threads, which
    # a plain join would wait on forever), then joining the non-daemon threads
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _release_sweep_workers() -> None:
    """Stop a joblib sweep's idle loky workers by force: a worker whose interpreter shutdown deadlocks (litellm's HTTP
    finalizer) would otherwise hold the command for ever."""
    executor = sweep_executor()
    if executor is not None:
        executor.shutdown(wait=True, kill_workers=True)
