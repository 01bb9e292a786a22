"""The fault matrix (issue 33): every fault a provider, the tracking store, the disk or the operator inflicts,
crossed with every mode, each cell held to the same invariants (``faults.invariants``):

- the documented exit code; on a failure one line saying what happened, no traceback;
- no instance lost: the same command, the fault removed, completes every instance (journal count = data count);
- the spend the jobs report (metrics.json, earlier attempts included) is at least what the stub billed (kill -9 with
  requests in flight: its tokens and requests too, and no cache hit counted as a call), and the budget ledger within
  the budget when one is set;
- no sentinel secret (a header on every role, the key in the environment, a password in a URL) in any file under
  the cell's folder (output root, journal, cache, MLflow store) or in anything printed;
- and first, that the fault really happened (the stub's counters, the job's own counts, the process gone).

Each cell is the real CLI's command on the stub (cupid_exp/testing/stub_llm_server.py, its Batch API queue: the
faults are the wire's), 2 instances a job (synthesis: one persona), the stub answering at once, ``tracking=none``
except where the store is the fault or is checked (a joblib sweep's SIGTERM: every run KILLED). A command runs in the
test's process through the CLI's entry (``helpers.cli_runner.run_job``: its exit code, and everything written to fds
1 and 2, its worker processes' and a sweep's loky workers' too, which it keeps for the next command, each starting
on them as on new ones: ``helpers.sweep_workers``) wherever the process is not the point: the stub's faults, the
``corrupt_*`` files, the full disk at the start, and every resume. A process of its own only where it is: kill -9
(also at the store's creation), SIGTERM, Ctrl-C, and the faults injected while the job runs (the tracking server's
death, the disk filling up). The table is ``catalogue.table()`` (a test keeps it so): the exit
code each cell must end with, ``N/A`` where the cell makes no sense (why: below), ``xfail`` where the behaviour has
not landed or the product is wrong, ``flaky`` where it is wrong some of the time (the reasons are the markers', from
``faults.known``).

| fault | sync | batch | workers | sweep | synthesis |
|---|---|---|---|---|---|
| no_usage | 0 | 0 | 0 | 0 | 0 |
| timeout_under_budget | 4 | N/A | 4 | 4 | 4 |
| refused_401 | 2 | 2 | 2 | 2 | 2 |
| refused_insufficient_quota | 2 | 2 | 2 | 2 | 2 |
| batch_token_limit | N/A | 0 | N/A | N/A | N/A |
| tracking_server_dies | 5 | 5 | 5 | 5 | 5 |
| credentials_in_url | 2 | 2 | 2 | 2 | 2 |
| key_quoted_in_an_error | 3 | N/A | 3 | 3 | 3 |
| empty_choices | 0 | N/A | 0 | 0 | 0 |
| content_null | 0 | N/A | 0 | 0 | 0 |
| daily_limit | 75 | 75 | 75 | 75 | 75 |
| prompt_file_missing | 2 | 2 | 2 | 2 | 2 |
| rate_limited | 0 | 0 | 0 | 0 | 0 |
| server_errors | 0 | 0 | 0 | 0 | 0 |
| malformed_bodies | 0 | 0 | 0 | 0 | 0 |
| content_filter | 3 | N/A | 3 | 3 | 3 |
| timeouts | 0 | N/A | 0 | 0 | 0 |
| dead_endpoint | 2 | 2 | 2 | 2 | 2 |
| disk_fills_up | 5 | 5 | 5 | 5 | 5 |
| disk_full_at_start | 5 | 5 | 5 | 5 | 5 |
| kill_9 | killed | killed | killed | killed | killed |
| kill_9_at_store_creation | killed | killed | killed | killed | killed |
| corrupt_cache | 0 | 0 | 0 | 0 | 0 |
| corrupt_journal | 0 | 0 | 0 | 0 | 0 |
| corrupt_usage_ledger | 0 | 0 | 0 | 0 | 0 xfail |
| corrupt_budget_ledger | 0 | 0 | 0 | 0 | 0 |
| corrupt_lock | 0 | 0 | 0 | 0 | 0 |
| corrupt_batch_ledger | N/A | 0 | N/A | N/A | N/A |
| corrupt_mlflow_store | 0 | 0 | 0 | 0 | 0 |
| corrupt_persona_files | N/A | N/A | N/A | N/A | 0 |
| truncated | 3 | 3 | 3 | 3 | 3 |
| sigterm | 143 | 143 | 143 | 143 | 143 |
| outage | 0 | 0 | 0 | 0 | 0 |
| outage_beyond_patience | 75 | 75 | 75 | 75 | 75 |
| sporadic_429 | 0 | N/A | 0 | 0 | 0 |
| ctrl_c | 130 | 130 | 130 | 130 | 130 |

N/A:
- batch × timeout_under_budget, timeouts: a batch has no request that times out: its rows are polled for.
- batch × key_quoted_in_an_error, empty_choices, content_null: the Batch API's rows are answered by its queue, not
  the live endpoint: a live reply's fault has no batch form here (a row's failure is its status: server_errors).
- batch × content_filter: a content filter through the Batch API is a row's body, read as a live reply's.
- batch_token_limit outside batch: the enqueued-token limit is the Batch API's; live, a key's token limit is a
  TPM 429 (rate_limited).
- corrupt_batch_ledger outside batch: only the Batch API keeps a list of batches; corrupt_persona_files outside
  synthesis: only synthesis keeps a state file and persona files.
- batch × sporadic_429: a batch's rows are answered by its queue; its few uploads' 429s are the rate_limited row.

How each fault is made: the batch mode meets a refusal (401, ``insufficient_quota``, the daily limit) at its
upload, a 429 or a 5xx at its first uploads (and 5xx rows), a malformed body as a garbled output line; 429s come in
every way providers say the wait (``rate_limit_style="rotate"``: retry-after seconds, -ms, an HTTP date, OpenAI's
x-ratelimit-reset, Anthropic's reset time, only the message, nothing), each waited out (the stub counts early
retries); kill -9 lands at a seeded instant of the model phase, with requests in flight that the stub bills and the
resumed job reports at their worst case; so does
SIGTERM (to the command's process alone, as ``kill`` or a scheduler sends it), which the job must meet with its line
(a joblib sweep: one line a job it stopped, each job's run and the sweep's parent run ended KILLED). A
``corrupt_*`` fault is a state file turned to garbage when a job starts (``faults.drivers.CorruptDriver``): the response
cache and the list of batches before the only run (shared folders a new job may find broken), the others once a first
run made them; the job must run (exit 0), the file set aside with its bytes and one line naming it (the lock: only
taken and let go, its bytes are nobody's). A reply cut at max_tokens keeps its whole text (it parses: only its
finish_reason says so), live and in batch rows, and so does the longer request it is sent again as. An outage
resets every connection for a few seconds after the job's first answers (``outage_beyond_patience``: until the
resume, past ``calls.outage_patience_s=1``). Cells marked ``slow`` (sweeps, the tracking server, the disk, kills,
SIGTERM) run in CI too.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
from faults import invariants
from faults.catalogue import FAULTS, Arrangement, Evidence, Fault, table
from faults.drivers import DRIVERS, FaultMissed, in_process
from faults.modes import HEADER_SECRET, IN, KEY_SECRET, MODES, OUT, SECRETS, Cell, command, new_cell
from helpers.spend import billed_usd, settled

from cupid_exp.llm.retry import retry_after_s
from cupid_exp.testing.batch_api import BatchQueueConfig
from cupid_exp.testing.rate_limits import RATE_LIMIT_STYLES, rate_limit_reply
from cupid_exp.testing.stub_llm_server import StubConfig, StubServer

QUEUE = {"complete_after_s": 0.3}
RECORDED = ("x-api-key", "authorization")


def _cells():
    for fault in FAULTS:
        for mode in MODES:
            marks = []
            if mode in fault.na:
                marks.append(pytest.mark.skip(reason=f"N/A: {fault.na[mode]}"))
            if mode in fault.pending:
                marks.append(pytest.mark.xfail(strict=True, reason=fault.pending[mode]))
            if mode in fault.flaky:
                marks.append(pytest.mark.xfail(strict=False, reason=fault.flaky[mode]))
            if fault.slow or mode == "sweep":
                marks.append(pytest.mark.slow)
            yield pytest.param(fault, mode, id=f"{fault.name}-{mode}", marks=marks)


def switch_on(stub: StubServer, arrangement: Arrangement) -> None:
    stub.reconfigure(**arrangement.stub)
    for name, value in arrangement.queue.items():
        setattr(stub.batches.config, name, value)


def switch_off(stub: StubServer) -> None:
    """The stub as it was, its counters (what it billed) kept."""
    stub.reconfigure(StubConfig(record_headers=RECORDED))
    stub.batches.config = BatchQueueConfig(**QUEUE)


ATTEMPTS = 3  # a timed fault that missed its window (``FaultMissed``) is run again, new, at most this often


@pytest.mark.parametrize("fault,mode", list(_cells()))
def test_the_fault_keeps_every_invariant(fault: Fault, mode: str, tmp_path: Path) -> None:
    for attempt in range(ATTEMPTS):
        try:
            return _the_cell(fault, new_cell(mode, tmp_path / f"attempt{attempt}", attempt))
        except FaultMissed:
            if attempt == ATTEMPTS - 1:
                raise


def _the_cell(fault: Fault, cell: Cell) -> None:
    """One attempt at the cell: the stub, the faulted command, its checks, the resume and every invariant."""
    mode = cell.mode
    with StubServer(StubConfig(record_headers=RECORDED), batch=BatchQueueConfig(**QUEUE)) as stub:
        arrangement = fault.arrange(mode, cell, stub.port)
        with DRIVERS[fault.driver](cell, stub) as driver:
            run = partial(command, cell, stub.url, *driver.both, *arrangement.both, tracking=driver.tracking,
                          seed_store=driver.seed_store)
            budget = [f"calls.max_cost_usd={arrangement.budget}"] if arrangement.budget is not None else []
            switch_on(stub, arrangement)
            first = driver.run(run(*arrangement.on, *budget))
            stats = settled(stub)
            fault.happened(Evidence(stats, stub.batches, first, cell))
            invariants.ending(first, cell, fault.exit, fault.line(mode))
            if arrangement.budget is not None:
                invariants.within_budget(cell, arrangement.budget, billed_usd(stats, IN, OUT))
            outputs = [first.stdout, first.stderr]
            switch_off(stub)
            for repair in (arrangement.repair, driver.repair):
                if repair is not None:
                    repair()
            if fault.exit != 0:
                again = in_process(run(*arrangement.resume))  # an ordinary run, whatever stopped the first
                invariants.ending(again, cell, 0)
                outputs += [again.stdout, again.stderr]
            stats = settled(stub)
            # read while the driver still holds the cell (the disk's tmpfs is unmounted when it lets go)
            invariants.finished(cell)
            # a stopped attempt's requests in flight (kill -9; SIGTERM and Ctrl-C, which cancel them) are reported by
            # the resume at their worst case: tokens and requests too
            invariants.spend_covers(cell, stats, billed_usd(stats, IN, OUT),
                                    usage=fault.driver in ("kill", "sigterm", "ctrl_c"))
            invariants.no_secret(cell.tmp, outputs, [*SECRETS, *arrangement.secrets])
    if stats["total_received"]:  # the secrets were in play: sent as the config says
        assert stub.header_values["x-api-key"][HEADER_SECRET] and stub.header_values["authorization"][
            f"Bearer {KEY_SECRET}"], dict(stub.header_values)


def test_the_docstring_table_is_the_catalogue() -> None:
    assert table() in __doc__


@pytest.mark.parametrize("style", RATE_LIMIT_STYLES)
def test_each_way_of_saying_the_wait_is_read_as_the_wait_it_asks(style: str) -> None:
    """The stub's 429s mean what they say: the client's parser reads from each the wait the stub counts as asked."""
    now = 1_800_000_000.25
    body, headers, asked = rate_limit_reply(style, 0.3, now=now)
    told = retry_after_s(headers, body["error"]["message"], now=now)
    if style == "none":
        assert told is None and asked == 0
    else:
        assert told == pytest.approx(asked, abs=1e-3) and asked >= 0.3 - 1e-3


def test_a_retry_before_the_wait_asked_is_counted_early() -> None:
    import urllib.error
    import urllib.request

    def ask(url: str) -> int:
        request = urllib.request.Request(f"{url}/chat/completions", data=json.dumps(
            {"model": "stub", "messages": [{"role": "user", "content": "hello"}]}).encode(),
            headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status
        except urllib.error.HTTPError as refused:
            return refused.code

    with StubServer(fail_first=1, fail_first_kind="429", rate_limit_style="retry-after-ms", retry_after=2.0) as stub:
        assert (ask(stub.url), ask(stub.url)) == (429, 200)  # sent again at once: 2 s too early
        assert stub.stats()["early_retries"] == 1 and stub.stats()["rate_limit_styles"] == {"retry-after-ms": 1}


def test_an_in_process_run_reads_what_its_child_processes_print(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process runner reads fds 1 and 2, as a subprocess's pipes are read: a forked and a spawned process
    (a job's workers, a sweep's loky workers), each leaving by ``os._exit``, and a write below Python all reach the
    output a cell checks for tracebacks and secrets."""
    import multiprocessing
    import os

    from helpers.cli_runner import _printed
    from helpers.processes import say_and_leave

    monkeypatch.setenv("PYTHONUNBUFFERED", "1")  # the CLI's environment (``cli_env``), which a spawned child reads
    with _printed() as printed:
        print("from the job")
        for method in ("fork", "spawn"):
            child = multiprocessing.get_context(method).Process(target=say_and_leave,
                                                                args=(f"from a {method}ed child",))
            child.start()
            child.join(60)
            assert child.exitcode == 0
        os.write(2, b"below Python\n")
    out, err = printed
    assert out.splitlines() == ["from the job", "from a forked child", "from a spawned child"], printed
    assert err.splitlines() == ["from a forked child", "from a spawned child", "below Python"], printed


def test_a_process_kept_from_an_earlier_in_process_run_prints_into_the_run_it_prints_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A process started in one in-process run and kept for the next (a sweep's loky worker: ``helpers.sweep_workers``)
    writes into the output of the run it writes in, which reads it for tracebacks and secrets."""
    import multiprocessing

    from helpers.cli_runner import _printed
    from helpers.processes import say_when_told

    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    context = multiprocessing.get_context("spawn")
    told = context.Event()
    with _printed(kept=True) as first:
        child = context.Process(target=say_when_told, args=(told, "from a kept child"))
        child.start()
    with _printed(kept=True) as second:
        told.set()
        child.join(60)
    assert child.exitcode == 0
    assert first == ["", ""] and second == ["from a kept child\n"] * 2, (first, second)
