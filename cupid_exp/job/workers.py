"""``runtime.workers`` > 1: a job's model calls shared by several processes, each with its own event loop.

Why: every call costs the client a few milliseconds of CPU (litellm, the OpenAI SDK, our steps:
5-15 ms depending on the machine). At high concurrency and latency one core then bounds the call rate
below what the backend would take (``bench/scale.py``); more processes use more cores. On Linux a worker is
forked once the job's process has imported litellm (``start_method``), so it starts in a fraction of a second;
spawned (macOS, Windows, or a plan built with its clients) it pays for its own start (Python, ``import litellm``:
2-4 s of CPU). Each costs ~200 MB.

The job's process stays the job: it runs its share of the instances itself, and it alone journals records,
talks to the MLflow run and draws the progress bars. The others (with Ctrl-C left to the job)
take the next instance from a counter they share with it, and send back each finished instance with its
model calls and the usage counted since the last one; their log lines go through the same queue. Each
model's ``max_concurrency`` is split among the processes, so the provider sees the same bound.

A bug in a worker (any exception that is not a counted step failure) stops the job with the worker's
traceback, as it would in one process; so does a worker that dies.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import logging
import logging.handlers
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cupid_exp.config import RunConfig
from cupid_exp.data.loading import LoadedData
from cupid_exp.data.schema import Instance
from cupid_exp.job.execute import job_finisher, job_progress, run_instances, stopped_by_budget
from cupid_exp.job.plan import JobPlan, build_context
from cupid_exp.job.worker_count import auto_processes, can_spawn, is_auto
from cupid_exp.llm.client import drain_background_tasks
from cupid_exp.llm.retry import FatalProviderError
from cupid_exp.progress import InstanceObserver, wants_calls
from cupid_exp.results import InstanceResult

log = logging.getLogger(__name__)

POLL_S = 0.5  #: how often the job looks at its workers' liveness while none of them reports


class WorkerFailed(RuntimeError):
    """A worker process stopped on a bug or died: the job stops, as it would with the bug in its own process."""


def processes(cfg: RunConfig, todo: int) -> int:
    """How many processes share the calls: ``runtime.workers`` (``auto``: by the job's size, ``job.worker_count``),
    at most one per instance left and per slot of the least concurrent model (each process needs one), and 1
    where this process cannot spawn."""
    if is_auto(cfg):
        n, why = auto_processes(cfg, todo)
        log.log(logging.INFO if n > 1 else logging.DEBUG, "runtime.workers=auto: %d process%s (%s)", n,
                "es" if n > 1 else "", why)
        return n
    wanted = min(cfg.runtime.workers, todo, *(m.max_concurrency for m in cfg.model_configs()))
    if wanted <= 1:
        return 1
    if not can_spawn():
        log.warning("runtime.workers=%d: this process (start method %r) cannot start workers; the job runs its "
                    "calls alone", cfg.runtime.workers, multiprocessing.get_start_method(allow_none=True))
        return 1
    if wanted < cfg.runtime.workers:
        log.info("runtime.workers=%d: %d processes (one per instance left and per slot of the least concurrent "
                 "model at most)", cfg.runtime.workers, wanted)
    return wanted


def share(cfg: RunConfig, index: int, n: int) -> RunConfig:
    """``cfg`` for process ``index`` of ``n``: each model's ``max_concurrency`` split so that the processes
    together keep the configured bound."""
    if n == 1:
        return cfg
    out = copy.deepcopy(cfg)
    for model in out.model_configs():
        whole = model.max_concurrency
        model.max_concurrency = whole // n + (index < whole % n)
    return out


@dataclass
class WorkerSpec:
    """What a worker needs to run instances as the job would (everything checked by the job already)."""

    cfg: RunConfig  #: with this worker's share of each model's concurrency
    parts: tuple[str, ...]
    secrets: list[str]
    ledger: str | None = None  #: the job's usage ledger: this process writes its own counts into it
    budget: Any = None  #: the job's spending limits (``llm.budget.Budget``: ledger files shared by every process)


@dataclass
class Shared:
    """What the job's process and its workers share: the next instance's index, the go, and whether to send
    each instance's model calls (the MLflow run traces them; known once the run is open)."""

    counter: Any
    go: Any
    wants_calls: Any
    ready: Any  #: workers whose clients are built (they wait for the go)


class SharedCursor:
    """Hands out the next instance left to run, across processes (a shared counter under its lock)."""

    def __init__(self, counter: Any, instances: list[Instance]):
        self.counter, self.instances = counter, instances

    def __call__(self) -> Instance | None:
        with self.counter.get_lock():
            index = self.counter.value
            if index >= len(self.instances):
                return None
            self.counter.value = index + 1
        return self.instances[index]

    def stop(self) -> None:
        """No process takes another instance (a fatal provider refusal)."""
        with self.counter.get_lock():
            self.counter.value = len(self.instances)


# -- in a worker ------------------------------------------------------------------------------------------------
def _exit_with_parent() -> None:
    """A worker whose job died (SIGKILL) would otherwise run its calls for nobody and hang on a full queue."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="cupid-parent-watch", daemon=True).start()


def _log_to(outbox: Any) -> None:
    """This process's log lines go to the job's process, which writes them with its own handlers."""
    root = logging.getLogger()
    root.handlers = [logging.handlers.QueueHandler(outbox)]
    root.setLevel(logging.WARNING)
    logging.getLogger("cupid_exp").setLevel(logging.INFO)


def _worker_plan(spec: WorkerSpec) -> JobPlan:
    from cupid_exp.job.checks import prompt_set
    from cupid_exp.secrets import install_log_scrubber
    from cupid_exp.settings import make_setting

    install_log_scrubber(spec.secrets)
    cfg = spec.cfg
    prompts = prompt_set(cfg.prompts.dir)
    plan = JobPlan(cfg=cfg, resolved={}, output_dir=Path(cfg.paths.output_root), choices={}, parent_run=None,
                   data=LoadedData(instances=[]), prompts=prompts, setting=make_setting(cfg.setting),
                   parts=spec.parts, secrets=spec.secrets, identity="")
    if spec.ledger:
        from cupid_exp.durability.ledger import UsageLedger

        plan.meter.sink = UsageLedger(Path(spec.ledger)).append
    plan.ctx = build_context(cfg, prompts, plan.meter, spec.budget)
    return plan


def _work(spec: WorkerSpec, shared: "Shared", inbox: Any, outbox: Any) -> None:
    """A worker process: its clients built and the instances left to run received, it waits for the job's go
    (the run is open, the job calls models), then takes instances from the shared counter until none is left,
    each sent back as it finishes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the job decides, and stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # forked: not the job's handler (``Workers.stop`` ends us)
    _exit_with_parent()
    _log_to(outbox)
    code = 0
    try:
        plan = _worker_plan(spec)
        instances = pickle.loads(inbox.get())  # every instance left; the shared counter says which is next
        with shared.ready.get_lock():
            shared.ready.value += 1
        shared.go.wait()
        sent: dict[str, dict[str, float]] = {}

        def finished(instance: Instance, result: InstanceResult, calls: Any) -> None:
            # pickled here, so that an object that cannot cross shows up as this worker's bug, not as a loss
            outbox.put(pickle.dumps(("instance", instance.key, result, calls, plan.meter.since(sent))))

        async def run() -> None:
            await run_instances(plan, SharedCursor(shared.counter, instances), finished, None,
                                bool(shared.wants_calls.value))
            await drain_background_tasks()

        try:
            asyncio.run(run())
        except FatalProviderError as exc:  # the job stops taking instances and reports it
            outbox.put(pickle.dumps(("fatal", exc)))
        outbox.put(pickle.dumps(("done", os.getpid(), plan.meter.since(sent), time.process_time())))
    except BaseException:  # noqa: BLE001 - every failure here is the job's to raise
        outbox.put(pickle.dumps(("bug", os.getpid(), traceback.format_exc())))
        code = 1
    outbox.close()
    outbox.join_thread()  # everything sent is in the pipe
    os._exit(code)  # no interpreter teardown (litellm's objects: a second or more)


# -- in the job's process ---------------------------------------------------------------------------------------
# What every calls process imports before its first call: imported once, by the job's process, before a forked
# worker starts (``start_method``).
CLIENT_MODULES = ("litellm", "cupid_exp.llm.client", "cupid_exp.llm.steps", "cupid_exp.evaluators",
                  "cupid_exp.rendering", "cupid_exp.settings", "cupid_exp.job.checks")


def start_method() -> str:
    """``fork`` on Linux, ``spawn`` elsewhere (macOS's system libraries are not fork-safe; Windows has no fork).

    Why fork: a spawned worker imports litellm again (3-4 s of CPU, measured) while the job's process does the
    same, on the cores the job's own start needs. Forked after those imports and before any client, cache or
    event loop exists (``start_workers``), a worker starts with them done and builds its own clients as a
    spawned one does."""
    return "fork" if sys.platform.startswith("linux") else "spawn"


class Workers:
    """The job's side: its worker processes, started with the job, and a thread that moves their messages onto
    the event loop once the job calls models."""

    def __init__(self, plan: JobPlan, method: str = "spawn"):
        ctx = multiprocessing.get_context(method)
        self.todo = plan.todo
        self.shared = Shared(counter=ctx.Value("q", 0), go=ctx.Event(), wants_calls=ctx.Value("b", 0),
                             ready=ctx.Value("i", 0))
        # the instances go through a queue, not the process's arguments: those are written to the child before
        # start() returns (blocking the job while the child imports), and forever if the child dies first
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        self.processes = []
        for index in range(1, plan.processes):
            spec = WorkerSpec(cfg=share(plan.cfg, index, plan.processes), parts=plan.parts, secrets=list(plan.secrets),
                              ledger=str(plan.ledger.path) if plan.ledger is not None else None,
                              budget=plan.budget)
            process = ctx.Process(target=_work, args=(spec, self.shared, self.inbox, self.outbox),
                                  name=f"cupid-calls-{index}", daemon=True)
            process.start()
            self.processes.append(process)
        instances = pickle.dumps(self.todo, protocol=pickle.HIGHEST_PROTOCOL)
        for _ in self.processes:
            self.inbox.put(instances)  # its feeder thread writes; never waits here
        self.running = {p.pid for p in self.processes}
        self.cpu_seconds = 0.0
        self._stop = threading.Event()
        log.info("model calls shared by %d processes (runtime.workers; %s)", plan.processes,
                 "forked" if method == "fork" else "spawned")

    def go(self, with_calls: bool) -> None:
        self.shared.wants_calls.value = int(with_calls)
        self.shared.go.set()

    def listen(self, loop: asyncio.AbstractEventLoop, handle: Any) -> threading.Thread:
        """Each message, unpickled, goes to ``handle`` on ``loop``; a worker that exits without its last word
        becomes a ("died", …) message."""
        def run() -> None:
            reported: set[int] = set()  # workers whose last word ("done" or "bug") came
            seen_dead = False
            while not self._stop.is_set():
                try:
                    message = self.outbox.get(timeout=POLL_S)
                except queue.Empty:
                    dead = [p for p in self.processes if p.pid not in reported and p.exitcode is not None]
                    if not (dead and seen_dead):  # a worker flushes before it exits: one more empty poll
                        seen_dead = bool(dead)
                        continue
                    message = ("died", dead[0].name, dead[0].exitcode)
                    reported.add(dead[0].pid)
                else:
                    if not isinstance(message, logging.LogRecord):
                        message = pickle.loads(message)
                        if message[0] in ("done", "bug"):
                            reported.add(message[1])
                try:
                    loop.call_soon_threadsafe(handle, message)
                except RuntimeError:  # the loop has closed: the job is over
                    return

        thread = threading.Thread(target=run, name="cupid-workers-inbox", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """Stop listening; end workers still running (an interrupted or failed job). Once is enough."""
        if self._stop.is_set():
            return
        self._stop.set()
        for process in self.processes:
            if process.exitcode is None:
                process.terminate()
        for process in self.processes:
            process.join(5)
        for channel in (self.inbox, self.outbox):
            channel.cancel_join_thread()  # a worker that died never read its part: exit must not wait on it
            channel.close()


async def _spread(plan: JobPlan, todo: list[Instance], observer: InstanceObserver | None, workers: Workers,
                  calls: bool) -> list[InstanceResult]:
    loop = asyncio.get_running_loop()
    results: list[InstanceResult] = []
    finished = job_finisher(plan, observer, results)
    progress = job_progress(plan, len(todo))
    by_key = {instance.key: instance for instance in todo}
    all_done: asyncio.Future[None] = loop.create_future()
    fatal: list[FatalProviderError] = []
    cursor = SharedCursor(workers.shared.counter, todo)

    def handle(message: Any) -> None:
        if all_done.done():
            return
        if isinstance(message, logging.LogRecord):
            logging.getLogger(message.name).handle(message)
            return
        kind = message[0]
        if kind == "instance":
            _, key, result, calls, counts = message
            plan.meter.merge(counts)
            finished(by_key[key], result, calls)
            progress.instance_done()
        elif kind == "done":
            _, pid, counts, cpu_seconds = message
            plan.meter.merge(counts)
            workers.cpu_seconds += cpu_seconds
            workers.running.discard(pid)
            if not workers.running:
                all_done.set_result(None)
        elif kind == "fatal":
            fatal.append(message[1])
            cursor.stop()
        elif kind == "bug":
            all_done.set_exception(WorkerFailed(f"a worker process stopped on a bug:\n{message[2]}"))
        elif kind == "died":
            all_done.set_exception(WorkerFailed(f"worker process {message[1]} died (exit code {message[2]}) "
                                                "before it finished its instances"))

    async def own_share() -> None:
        try:
            await run_instances(plan, cursor, finished, progress, calls)
        except FatalProviderError as exc:  # the workers finish what they have in flight first
            fatal.append(exc)

    workers.listen(loop, handle)
    try:
        await asyncio.gather(own_share(), all_done)
    finally:
        progress.close()
    await drain_background_tasks()
    if fatal:
        raise fatal[0]
    if len(results) != len(todo) and not stopped_by_budget(plan.meter):  # taken and sent back, or the job failed
        raise WorkerFailed(f"{len(todo) - len(results)} of {len(todo)} instances were taken and never reported")
    return results


def start_workers(plan: JobPlan) -> Workers | None:
    """The job's worker processes, when it has some (``plan.processes``); stop them with ``Workers.stop``.

    Forked (``start_method``) only before the job's clients exist (``run_job`` starts them before ``connect``): a
    forked worker must not inherit them (their response cache holds an SQLite connection, their endpoints the
    job's share of each limit). Spawned where the plan has its clients already, and where litellm's native runtime
    has started in this process (a native route ran: litellm's Router, which the client no longer uses, among them):
    it does not survive a fork. The client's own calls leave it unstarted, so a sweep's later jobs fork too."""
    if plan.processes <= 1:
        return None
    method = start_method() if plan.ctx is None else "spawn"
    if method == "fork":
        for name in CLIENT_MODULES:
            importlib.import_module(name)
        from cupid_exp.llm._litellm import import_first_call_modules, native_runtime_started

        import_first_call_modules()
        if native_runtime_started():  # a native route of litellm ran in this process
            method = "spawn"
        for stream in (sys.stdout, sys.stderr):  # what is buffered is written once, by the job's process
            stream.flush()
    return Workers(plan, method)


def run_spread(plan: JobPlan, todo: list[Instance], observer: InstanceObserver | None, workers: Workers
               ) -> tuple[list[InstanceResult], float]:
    """Run ``todo`` over the job's process and its ``workers``; the results and the workers' CPU time."""
    if [i.key for i in todo] != [i.key for i in workers.todo]:
        raise RuntimeError("the workers were started for other instances than the job runs")
    calls = wants_calls(observer)
    workers.go(calls)
    return asyncio.run(_spread(plan, todo, observer, workers, calls)), workers.cpu_seconds
