"""Phase 2 of a job: run the units left, here and, with ``runtime.workers`` > 1, in worker processes (one core
bounds the call rate); journal each and tell the MLflow run. Only the job's process journals, tracks and draws
progress; each model's ``max_concurrency`` is split among processes."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import multiprocessing
import pickle
import queue
import sys
import threading
import time
from typing import Any, Callable, Literal

from cupid_exp.job.heap import long_lived_frozen
from cupid_exp.job.lanes import fair_share, job_finisher, job_progress, run_units, together
from cupid_exp.job.spec import Execution, Job, Result
from cupid_exp.job.worker_process import Report, Shared, SharedCursor, WorkerFailed, WorkerSpec, serve_units
from cupid_exp.llm.client import drain_background_tasks
from cupid_exp.llm.retry import FatalProviderError
from cupid_exp.llm.server import managed_server
from cupid_exp.progress import InstanceObserver, wants_calls

log = logging.getLogger(__name__)

POLL_S = 0.5  #: how often the job looks at its workers' liveness while none of them reports
EXIT_GRACE_S = 5.0  #: how long the workers that said "done" have, together, to exit before they are killed

# What every calls process imports before its first call: imported once, by the job's process, before a forked
# worker starts (``start_workers``), with the work's own modules (``Work.client_modules``).
CLIENT_MODULES = ("litellm", "cupid_exp.llm.client", "cupid_exp.llm.steps", "cupid_exp.job.checks")


class Workers:
    """The job's side: its worker processes, and a thread moving their messages onto the event loop."""

    def __init__(self, job: Job, method: Literal["fork", "spawn"] = "spawn"):
        ctx = multiprocessing.get_context("fork") if method == "fork" else multiprocessing.get_context("spawn")
        self.todo = job.todo
        attempt = job.attempt
        self.shared = Shared(counter=ctx.Value("q", 0), go=ctx.Event(), wants_calls=ctx.Value("b", 0),
                             ready=ctx.Value("i", 0))
        # the units go through a queue, not the process's arguments: those are written to the child before
        # start() returns (blocking the job while the child imports), and forever if the child dies first
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        self.processes = []
        work = dataclasses.replace(job.work, units=(), tracking=None)  # the units go through the queue
        for index in range(1, attempt.processes):
            spec = WorkerSpec(work=work, index=index, secrets=list(job.spec.secrets),
                              ledger=str(attempt.ledger.path) if attempt.ledger is not None else None,
                              budget=attempt.budget, processes=attempt.processes)
            process = ctx.Process(target=serve_units, args=(spec, self.shared, self.inbox, self.outbox),
                                  name=f"cupid-calls-{index}", daemon=True)
            process.start()
            self.processes.append(process)
        units = pickle.dumps(self.todo, protocol=pickle.HIGHEST_PROTOCOL)
        for _ in self.processes:
            self.inbox.put(units)  # its feeder thread writes; never waits here
        self.running = {p.pid for p in self.processes}
        self.cpu_seconds = 0.0
        self._stop = threading.Event()
        log.info("model calls shared by %d processes (runtime.workers; %s)", attempt.processes,
                 "forked" if method == "fork" else "spawned")

    def listen(self, loop: asyncio.AbstractEventLoop, handle: Callable[[logging.LogRecord | Report], None]) -> None:
        """Each message goes to ``handle`` on ``loop``; a worker exiting without its last word is a ``died`` report."""
        def run() -> None:
            reported: set[int | None] = set()  # workers whose last word ("done" or "failed") came
            seen_dead = False
            while not self._stop.is_set():
                try:
                    message = self.outbox.get(timeout=POLL_S)
                except queue.Empty:
                    dead = [p for p in self.processes if p.pid not in reported and p.exitcode is not None]
                    if not (dead and seen_dead):  # a worker flushes before it exits: one more empty poll
                        seen_dead = bool(dead)
                        continue
                    message = Report("died", error=f"worker process {dead[0].name} died (exit code "
                                                   f"{dead[0].exitcode})")
                    reported.add(dead[0].pid)
                else:
                    if not isinstance(message, logging.LogRecord):
                        message = pickle.loads(message)
                        if message.kind in ("done", "failed"):
                            reported.add(message.pid)
                try:
                    loop.call_soon_threadsafe(handle, message)
                except RuntimeError:  # the loop has closed: the job is over
                    return

        threading.Thread(target=run, name="cupid-workers-inbox", daemon=True).start()

    def stop(self) -> None:
        """Stop listening; end workers still running (an interrupted or failed job). Once is enough."""
        if self._stop.is_set():
            return
        self._stop.set()
        leaving_by = time.monotonic() + EXIT_GRACE_S
        for process in self.processes:
            if process.pid not in self.running:  # its last word came: it is leaving, and exits 0 unless killed
                process.join(max(0.0, leaving_by - time.monotonic()))
            if process.exitcode is None:
                process.kill()  # it ignores stop signals (``worker_process.serve_units``)
        for process in self.processes:
            process.join(5)
        for channel in (self.inbox, self.outbox):
            channel.cancel_join_thread()  # a worker that died never read its part: exit must not wait on it
            channel.close()


async def _spread(job: Job, todo: list[Any], observer: InstanceObserver | None, workers: Workers,
                  calls: bool) -> list[Result]:
    loop = asyncio.get_running_loop()
    results: list[Result] = []
    meter = job.attempt.meter
    finished = job_finisher(job, observer, results)
    progress = job_progress(job, len(todo))
    by_key = {unit.key: unit for unit in todo}
    all_done: asyncio.Future[None] = loop.create_future()
    fatal: list[FatalProviderError] = []
    cursor = SharedCursor(workers.shared.counter, todo)

    def handle(message: logging.LogRecord | Report) -> None:
        if all_done.done():
            return
        if isinstance(message, logging.LogRecord):
            logging.getLogger(message.name).handle(message)
            return
        kind = message.kind
        meter.merge(message.counts)
        if kind == "unit":
            finished(by_key[message.key], message.result, message.calls)
            progress.instance_done()
        elif kind == "done":
            workers.cpu_seconds += message.cpu_seconds
            workers.running.discard(message.pid)
            if not workers.running:
                all_done.set_result(None)
        elif kind == "fatal":
            fatal.append(message.error)
            cursor.stop()
        elif kind == "failed":  # a bug (WorkerFailed, its traceback), or a full disk (one line, exit 5)
            all_done.set_exception(message.error)
        elif kind == "died":
            all_done.set_exception(WorkerFailed(f"{message.error} before it finished its {job.work.noun}s"))

    async def own_share() -> None:
        try:
            await run_units(job.work.kind, job.ctx, job.lanes, cursor, finished, progress, calls,
                            fair_share(len(todo), job.attempt.processes))
        except FatalProviderError as exc:  # the workers finish what they have in flight first
            fatal.append(exc)

    workers.listen(loop, handle)
    try:
        await together(own_share(), all_done)  # a worker's failure stops this process's lanes too
    finally:
        progress.close()
    await drain_background_tasks()
    if fatal:
        raise fatal[0]
    # taken and sent back, or the job failed (unless some process of the job was refused a call by its budget)
    if len(results) != len(todo) and meter.totals().get("not_sent_budget", 0.0) <= 0:
        raise WorkerFailed(f"{len(todo) - len(results)} of {len(todo)} {job.work.noun}s were taken and never "
                           "reported")
    return results


def start_workers(job: Job) -> Workers | None:
    """The job's worker processes, if any. Forked only before the clients exist (a fork must not inherit their cache
    connection or limits), and before litellm's native runtime; spawned otherwise."""
    if job.attempt.processes <= 1:
        return None
    # ``fork`` on Linux (litellm already imported), ``spawn`` elsewhere (macOS is not fork-safe)
    method: Literal["fork", "spawn"] = "fork" if sys.platform.startswith("linux") and job.ctx is None else "spawn"
    if method == "fork":
        for name in (*CLIENT_MODULES, *job.work.client_modules):
            importlib.import_module(name)
        from cupid_exp.llm._litellm import import_first_call_modules, native_runtime_started

        import_first_call_modules()
        if native_runtime_started():  # a native route of litellm ran in this process
            method = "spawn"
        for stream in (sys.stdout, sys.stderr):  # what is buffered is written once, by the job's process
            stream.flush()
    return Workers(job, method)


async def _run_all(job: Job, units: list[Any], observer: InstanceObserver | None = None) -> list[Result]:
    progress = job_progress(job, len(units))
    results: list[Result] = []
    pending = iter(units)
    try:
        await run_units(job.work.kind, job.ctx, job.lanes, lambda: next(pending, None),
                        job_finisher(job, observer, results), progress, wants_calls(observer))
    finally:
        progress.close()
    await drain_background_tasks()
    return results


def execute(job: Job, observer: InstanceObserver | None = None, workers: Workers | None = None) -> Execution:
    """Run what is left inside the work's model server, if any; ``observer`` hears of each finished unit."""
    todo = job.todo
    if not todo:
        return Execution([])
    assert job.ctx is not None, "connect(job) before execute (run_job does, between its workers and the run)"
    server = job.work.model_server if not job.dry_run else None
    with managed_server(server), long_lived_frozen():
        start, cpu = time.perf_counter(), time.process_time()  # without a model server's start-up
        if job.attempt.processes > 1:
            running = workers or start_workers(job)
            assert running is not None  # more than one process: start_workers starts them
            try:
                if [i.key for i in todo] != [i.key for i in running.todo]:
                    raise RuntimeError(f"the workers were started for other {job.work.noun}s than the job runs")
                calls = wants_calls(observer)
                running.shared.wants_calls.value = int(calls)
                running.shared.go.set()
                results = asyncio.run(_spread(job, todo, observer, running, calls))
                workers_cpu = running.cpu_seconds
            finally:
                if running is not workers:
                    running.stop()
        else:
            results, workers_cpu = asyncio.run(_run_all(job, todo, observer)), 0.0
        return Execution(results, time.perf_counter() - start, time.process_time() - cpu + workers_cpu)
