"""The faults of the matrix: what each switches on in a mode (the stub's config, the Batch API queue's, CLI
overrides), the exit code the README documents for it, what its one line says, and how a cell checks that the
fault really happened (the stub's counters, the job's own counts) before it trusts a pass.

A fault is removed for the resume by putting the stub back as it was and leaving out the ``on`` overrides; ``both``
stay (they are the job, not the fault), ``resume`` is what the README says a resume needs (a higher budget,
``runtime.retry_failed=true``)."""

from __future__ import annotations

import json
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from helpers.spend import journaled

from cupid_exp.prompts import PROJECT_PROMPTS
from cupid_exp.testing.rate_limits import RATE_LIMIT_STYLES
from faults import known
from faults.invariants import job_metrics
from faults.modes import Cell, roles

URL_SECRET = "urlpass-faultmatrix-SENTINEL-3b"

@dataclass(frozen=True)
class Arrangement:
    stub: Mapping[str, Any] = field(default_factory=dict)  # StubConfig fields while the fault is on
    queue: Mapping[str, Any] = field(default_factory=dict)  # BatchQueueConfig fields while it is on
    on: tuple[str, ...] = ()  # CLI overrides of the faulted run only
    both: tuple[str, ...] = ()  # CLI overrides of both runs
    resume: tuple[str, ...] = ()  # CLI overrides of the resume only
    budget: float | None = None  # calls.max_cost_usd of the faulted run (its override added to ``on``)
    repair: Callable[[], None] | None = None  # removes a fault that is not the stub's (a prompt file put back)
    secrets: tuple[str, ...] = ()  # sentinels of its own, besides the cell's


@dataclass
class Evidence:
    """What a cell saw of its faulted run: the stub's counters (settled), its batch queue, the run, the cell."""

    stats: dict[str, Any]
    queue: Any
    proc: Any
    cell: Cell

    def faults(self, kind: str) -> int:
        return sum(kinds.get(kind, 0) for kinds in self.stats["faults"].values())


@dataclass(frozen=True)
class Fault:
    name: str
    exit: int  #: the documented exit code (-9: killed by the test)
    says: str | Mapping[str, str]  #: what the failure's one line contains (by mode, where it differs)
    arrange: Callable[[str, Cell, int], Arrangement]  #: (mode, cell, stub port) -> what to switch on
    happened: Callable[[Evidence], None]
    na: Mapping[str, str] = field(default_factory=dict)  #: mode -> why the cell makes no sense
    pending: Mapping[str, str] = field(default_factory=dict)  #: mode -> why it fails today (xfail, strict)
    flaky: Mapping[str, str] = field(default_factory=dict)  #: mode -> why it fails some of the time (xfail, not strict)
    driver: str = "stub"  #: how it is driven (``faults.drivers.DRIVERS``)
    slow: bool = False

    def line(self, mode: str) -> str:
        return self.says if isinstance(self.says, str) else self.says[mode]


def _steps(mode: str, evaluation: tuple[str, ...], synthesis: tuple[str, ...]) -> tuple[str, ...]:
    """The steps a retried fault hits: synthesis is a chain of ~60 calls, so only a few of its steps."""
    return synthesis if mode == "synthesis" else evaluation


def _first_attempts(kinds: str, n: int = 1, *, queue: Mapping[str, Any] | None = None, both: tuple[str, ...] = (),
                    **stub: Any) -> Callable[[str, Cell, int], Arrangement]:
    """The first ``n`` attempts of every prompt answered with ``kinds`` in turn (synthesis: of two of its steps)."""
    def arrange(mode: str, cell: Cell, port: int) -> Arrangement:
        steps = _steps(mode, (), ("persona", "changed_preference"))
        return Arrangement(stub={"fail_first": n, "fail_first_kind": kinds, "fault_steps": steps, **stub},
                           queue=queue or {}, both=both)
    return arrange


def _retried_in_every_job(ev: Evidence, kind: str) -> None:
    assert ev.faults(kind) >= ev.cell.jobs, ev.stats["faults"]
    assert all(m["calls/retries"] + m.get("calls/rate_limited", 0) >= 1 for m in job_metrics(ev.cell))


def _refused(kind: str) -> Callable[[Evidence], None]:
    def happened(ev: Evidence) -> None:
        refusals = ev.queue.upload_refusals if ev.cell.mode == "batch" else ev.faults(kind)
        assert refusals >= 1 and ev.stats["total_completed"] == 0, ev.stats
    return happened


def _refusal(kind: str) -> Callable[[str, Cell, int], Arrangement]:
    return lambda mode, cell, port: (Arrangement(queue={"refuse_upload": kind}) if mode == "batch"
                                     else Arrangement(stub={"refuse": kind}))


def _sent(ev: Evidence) -> None:
    """The job had sent (its driver checked it still ran at the fault)."""
    assert ev.stats["total_received"] or ev.queue.uploads, ev.stats


def _nothing_sent(ev: Evidence) -> None:
    assert ev.stats["total_received"] == 0 and ev.queue.uploads == 0, ev.stats


def _dead_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LOST_PROMPT = {"synthesis": "synthesis/persona_generator.yaml"}  # else evaluation/preference_inferrer.yaml


def _missing_prompt(mode: str, cell: Cell, port: int) -> Arrangement:
    """A copy of the project's prompts lacking one file the job sends; the resume has it back."""
    folder = cell.tmp / "prompts"
    shutil.copytree(PROJECT_PROMPTS, folder)
    lost = folder / LOST_PROMPT.get(mode, "evaluation/preference_inferrer.yaml")
    kept = lost.read_bytes()
    lost.unlink()
    return Arrangement(both=(f"prompts.dir={folder}",), repair=lambda: lost.write_bytes(kept))


def _styles_honoured(ev: Evidence) -> None:
    assert set(ev.stats["rate_limit_styles"]) == set(RATE_LIMIT_STYLES), ev.stats["rate_limit_styles"]
    assert ev.stats["early_retries"] == 0  # every wait asked for was waited out


def _refused_at_random_and_waited(ev: Evidence) -> None:
    """The stub refused some requests at random, and each was sent again only after the wait it asked."""
    assert ev.faults("429") >= 1 and ev.stats["early_retries"] == 0, ev.stats


def _server_errors(ev: Evidence) -> None:
    if ev.cell.mode == "batch":
        assert ev.queue.upload_faults == 2 and ev.queue.rows_failed >= 1
    else:
        assert ev.faults("500") >= 1 and ev.faults("503") >= 1, ev.stats["faults"]


def _malformed(ev: Evidence) -> None:
    if ev.cell.mode == "batch":
        assert ev.queue.rows_garbled >= 1
    else:
        assert all(ev.faults(kind) >= 1 for kind in ("truncated", "content_type", "no_choices")), ev.stats["faults"]


def _filtered(ev: Evidence) -> None:
    kinds = {e["kind"] for r in journaled(ev.cell.root) for e in r["errors"]}
    assert "content_filter" in kinds or ev.cell.mode == "synthesis", kinds  # synthesis journals no failed persona
    assert ev.stats["total_completed"] >= 1


TRUNCATED = ("infer",)  #: the evaluation step whose replies are cut (the first of each instance)


def _cut_twice(ev: Evidence) -> None:
    """Each cut reply's request was sent once more (longer), cut again, and counted as truncated, never scored."""
    step = "persona" if ev.cell.mode == "synthesis" else TRUNCATED[0]
    assert ev.faults("length") >= 2 * ev.cell.jobs, ev.stats["faults"]
    assert all(m.get(f"calls/{step}/truncated_attempt", 0) >= 2 for m in job_metrics(ev.cell)), job_metrics(ev.cell)
    if ev.cell.mode != "synthesis":  # synthesis journals no failed persona
        errors = [(e["step"], e["kind"]) for r in journaled(ev.cell.root) for e in r["errors"]]
        assert errors == [(step, "truncated")] * ev.cell.instances * ev.cell.jobs, errors


def _echoed(ev: Evidence) -> None:
    assert ev.faults("echo_key") >= 1, ev.stats["faults"]


def _estimated(ev: Evidence) -> None:
    """Replies went without usage, and every job said it estimated some."""
    assert ev.stats["billed"]["requests"] >= 1, ev.stats
    assert all(m["tokens/estimated_calls"] >= 1 for m in job_metrics(ev.cell))


def _held_for_the_token_limit(ev: Evidence) -> None:
    assert ev.queue.token_limit_rejections >= 1, [b.tokens for b in ev.queue.batches.values()]


def _timed_out(ev: Evidence) -> None:
    """Requests the client gave up on were processed and billed all the same."""
    assert ev.faults("slow") >= 1 and ev.stats["billed"]["requests"] > ev.stats["total_completed"], ev.stats


def _corrupted(ev: Evidence) -> list[Path]:
    """The state files ``faults.drivers.CorruptDriver`` turned to garbage before the run."""
    return [Path(p) for p in json.loads((ev.cell.tmp / "corrupted.json").read_text())]


def _set_aside(ev: Evidence) -> None:
    """Each garbage file was set aside whole, its bytes kept (alone, or in its folder: the response cache's), and one
    warning line named it."""
    from faults.drivers import GARBAGE

    printed = (ev.proc.stdout + ev.proc.stderr).splitlines()
    for path in _corrupted(ev):
        kept = [*path.parent.glob(f"{path.name}.corrupt-*"), *(
            folder / path.name for folder in path.parent.parent.glob(f"{path.parent.name}.corrupt-*"))]
        assert [p.read_bytes() for p in kept] == [GARBAGE], (path, kept)
        named = path if kept[0].name != path.name else path.parent
        said = [line for line in printed if f"{named} is unreadable" in line]
        assert said and f"set aside as {(kept[0] if named == path else kept[0].parent).name}" in said[0], printed[-20:]


def _lock_taken(ev: Evidence) -> None:
    """The lock's bytes are the operating system's business and its holder note only names a process: garbage in
    both stops nothing; the job took the lock and let it go (its note, written anew, removed with it)."""
    for path in _corrupted(ev):
        assert path.exists() and not path.with_name(path.name + ".holder.json").exists(), path


#: synthesis's one persona is one chain: its first call's 4 requests (num_retries=3), each charged its worst case
#: (~$0.00135), come to ~$0.0054, under $0.006, and the persona fails on its timeouts (exit 3) before a budget of
#: $0.006 binds; at ~2.5 requests' worth the budget refuses the third request
_TIMEOUT_BUDGET = {"synthesis": 0.0034}
OUTAGE_S = 3.0  #: seconds the stub leaves every request unanswered, once the job's first requests were answered
OUTAGE_RETRIES = ("calls.num_retries=1",)  #: a call's retries (0.5 + 1 s at most) end well inside the outage


def _outage(mode: str, seconds: float) -> dict[str, Any]:
    """The stub stops answering (connections reset) after the job's first requests: a sweep's two jobs and two
    workers each had an answer first (a process that never had one would take it for a dead endpoint); synthesis
    is a chain, its calls go out one after another."""
    return {"outage_after": {"sync": 3, "batch": 3, "synthesis": 4}.get(mode, 6), "outage_s": seconds,
            "outage_kind": "reset"}


def _unanswered(ev: Evidence) -> None:
    """Requests went unanswered after the job's first ones were answered (it starts after ``outage_after``); a job
    stopped for later writes no metrics: its line names the patience."""
    outage = ev.stats["outage"]
    assert outage["unanswered"] >= 1 and outage["started"] is not None, outage


def _outage_happened(ev: Evidence) -> None:
    """Requests went unanswered after some were answered, and (a job's own count) a pool paused for it."""
    _unanswered(ev)
    assert ev.stats["outage"]["ended"] is not None  # ... and it ended: later requests were answered
    if ev.cell.mode != "batch":  # a batch's polls wait on their own (no pool between them and the endpoint)
        assert any(sum(v for k, v in m.items() if k.startswith("pools/") and k.endswith("/outages")) >= 1
                   for m in job_metrics(ev.cell)), job_metrics(ev.cell)


NO_TIMEOUT_IN_A_BATCH = "a batch has no request that times out: its rows are polled for (hours of latency)"
NO_BATCH_ROW_FAULT = ("the Batch API's rows are answered by its queue, not the live endpoint: a live reply's fault has "
                      "no batch form here (a row's failure is its status in the output file: the 5xx row)")

FAULTS = [
    Fault("no_usage", 0, "", lambda mode, cell, port: Arrangement(stub={"omit_usage": True}), _estimated),
    Fault("timeout_under_budget", 4, "BUDGET:",
          lambda mode, cell, port: Arrangement(
              stub={"rate_slow": 1.0, "slow_s": 1.0, "fault_steps": _steps(mode, (), ("persona",))},
              both=("calls.timeout=0.4", "calls.num_retries=3"), budget=_TIMEOUT_BUDGET.get(mode, 0.006),
              resume=("calls.max_cost_usd=1",)),
          lambda ev: _timed_out(ev),
          na={"batch": NO_TIMEOUT_IN_A_BATCH}),
    Fault("refused_401", 2, "invalid_api_key", _refusal("401"), _refused("401")),
    Fault("refused_insufficient_quota", 2, "insufficient_quota", _refusal("insufficient_quota"),
          _refused("insufficient_quota")),
    Fault("batch_token_limit", 0, "", lambda mode, cell, port: Arrangement(queue={"enqueued_token_limit": 2500}),
          _held_for_the_token_limit,
          na={mode: "the enqueued-token limit is the Batch API's; live, a key's token limit is a TPM 429 (rate_limited)"
              for mode in ("sync", "workers", "sweep", "synthesis")}),
    Fault("tracking_server_dies", 5, "did not take this job's results",
          lambda mode, cell, port: Arrangement(stub={"latency_ms": 200}), lambda ev: None, driver="tracking",
          slow=True),
    Fault("credentials_in_url", 2, "carries credentials",
          lambda mode, cell, port: Arrangement(
              on=(f"{roles(mode)[1]}.api_base=http://fm:{URL_SECRET}@127.0.0.1:{port}/v1",), secrets=(URL_SECRET,)),
          _nothing_sent),
    Fault("key_quoted_in_an_error", 3, "INCOMPLETE:",
          lambda mode, cell, port: Arrangement(stub={"echo_key_steps": _steps(mode, ("infer",), ("persona",)),
                                                     "echo_key_status": 400}),
          _echoed, na={"batch": NO_BATCH_ROW_FAULT}),
    Fault("empty_choices", 0, "", _first_attempts("empty_choices"),
          lambda ev: _retried_in_every_job(ev, "empty_choices"), na={"batch": NO_BATCH_ROW_FAULT}),
    Fault("content_null", 0, "", _first_attempts("content_null"),
          lambda ev: _retried_in_every_job(ev, "content_null"), na={"batch": NO_BATCH_ROW_FAULT}),
    Fault("daily_limit", 75, "requests per day", _refusal("daily"), _refused("daily")),
    Fault("prompt_file_missing", 2, {"synthesis": "persona_generator.yaml", **{
        mode: "preference_inferrer.yaml" for mode in ("sync", "batch", "workers", "sweep")}}, _missing_prompt,
          _nothing_sent),
    Fault("rate_limited", 0, "",
          lambda mode, cell, port: Arrangement(
              stub={"rate_limit_style": "rotate", "retry_after": 0.3,
                    **({} if mode == "batch" else {"fail_first": 1, "fail_first_kind": "429",
                                                   "fault_steps": _steps(mode, (), ("persona", "factors"))})},
              queue={"fail_first_uploads": len(RATE_LIMIT_STYLES), "upload_fault_kinds": ("429",)}),
          _styles_honoured),
    Fault("server_errors", 0, "",
          _first_attempts("500,503", 2, queue={"fail_first_uploads": 2, "upload_fault_kinds": ("500", "503"),
                                               "fail_first_rows": 1}),
          _server_errors),
    Fault("malformed_bodies", 0, "",
          _first_attempts("truncated,content_type,no_choices", 3, queue={"garble_rows": 0.5}),
          _malformed),
    Fault("content_filter", 3, "INCOMPLETE:",
          lambda mode, cell, port: Arrangement(stub={"content_filter_steps": _steps(mode, ("infer",), ("persona",))},
                                               resume=("runtime.retry_failed=true",)),
          _filtered, na={"batch": "a content filter through the Batch API is a row's body, read as a live reply's"}),
    Fault("timeouts", 0, "", _first_attempts("slow", both=("calls.timeout=0.4",), slow_s=1.0), _timed_out,
          na={"batch": NO_TIMEOUT_IN_A_BATCH}),
    Fault("dead_endpoint", 2, "unreachable",
          lambda mode, cell, port: Arrangement(on=tuple(f"{role}.api_base=http://127.0.0.1:{_dead_port()}/v1"
                                                        for role in roles(mode))),
          _nothing_sent),
    Fault("disk_fills_up", 5, "environment failure: /", lambda mode, cell, port: Arrangement(stub={"latency_ms": 200}),
          lambda ev: None, driver="disk_fills", slow=True),
    Fault("disk_full_at_start", 5, "environment failure: /", lambda mode, cell, port: Arrangement(), lambda ev: None,
          driver="disk_full", slow=True),
    Fault("kill_9", -9, "", lambda mode, cell, port: Arrangement(stub={"latency_ms": 300}, budget=1.0,
                                                                 resume=("calls.max_cost_usd=1",)),
          lambda ev: None, driver="kill", slow=True),
    Fault("kill_9_at_store_creation", -9, "", lambda mode, cell, port: Arrangement(), lambda ev: None,
          driver="store", slow=True),
    # -- issue 40 item 3: whatever the cache or state holds, a rerun runs (each state file garbage when a job starts)
    Fault("corrupt_cache", 0, "", lambda mode, cell, port: Arrangement(), lambda ev: _set_aside(ev),
          driver="corrupt_cache"),
    Fault("corrupt_journal", 0, "", lambda mode, cell, port: Arrangement(), lambda ev: _set_aside(ev),
          driver="corrupt_journal"),
    Fault("corrupt_usage_ledger", 0, "", lambda mode, cell, port: Arrangement(), lambda ev: _set_aside(ev),
          driver="corrupt_usage_ledger", pending={"synthesis": known.SYNTHESIS_RECORDS_NO_USAGE}),
    Fault("corrupt_budget_ledger", 0, "", lambda mode, cell, port: Arrangement(budget=1.0),
          lambda ev: _set_aside(ev), driver="corrupt_budget_ledger"),
    Fault("corrupt_lock", 0, "", lambda mode, cell, port: Arrangement(), _lock_taken, driver="corrupt_lock"),
    Fault("corrupt_batch_ledger", 0, "", lambda mode, cell, port: Arrangement(), lambda ev: _set_aside(ev),
          driver="corrupt_batch_ledger", na={mode: "only the Batch API keeps a list of batches"
                                             for mode in ("sync", "workers", "sweep", "synthesis")}),
    Fault("corrupt_mlflow_store", 0, "", lambda mode, cell, port: Arrangement(), lambda ev: _set_aside(ev),
          driver="corrupt_mlflow_store", slow=True),
    Fault("corrupt_persona_files", 0, "", lambda mode, cell, port: Arrangement(), lambda ev: _set_aside(ev),
          driver="corrupt_persona_files", na={mode: "only synthesis keeps a state file and persona files"
                                              for mode in ("sync", "batch", "workers", "sweep")}),
    # issue 40, item 7: replies cut at max_tokens that still parse are a failure, not a score
    Fault("truncated", 3, "INCOMPLETE:",
          lambda mode, cell, port: Arrangement(stub={"length_steps": _steps(mode, TRUNCATED, ("persona",)),
                                                     "length_whole": True},
                                               resume=("runtime.retry_failed=true",)),
          _cut_twice),
    # issue 40, item 5: a stop always says so
    Fault("sigterm", 143, "interrupted (SIGTERM)",
          lambda mode, cell, port: Arrangement(stub={"latency_ms": 300}, budget=1.0,
                                               resume=("calls.max_cost_usd=1",)),
          _sent, driver="sigterm", slow=True),
    # issue 40, item 1: an outage is a pause
    Fault("outage", 0, "", lambda mode, cell, port: Arrangement(stub=_outage(mode, OUTAGE_S), both=OUTAGE_RETRIES),
          _outage_happened),
    Fault("outage_beyond_patience", 75, "calls.outage_patience_s=1",
          lambda mode, cell, port: Arrangement(stub=_outage(mode, float("inf")), both=OUTAGE_RETRIES,
                                               on=("calls.outage_patience_s=1",)),
          _unanswered),
    # issue 40 item 2: sporadic refusals (an overloaded provider) do not collapse the pace
    Fault("sporadic_429", 0, "", lambda mode, cell, port: Arrangement(
              stub={"rate_429": 0.2, "retry_after": 1.0, "rate_limit_style": "retry-after"}),
          _refused_at_random_and_waited,
          na={"batch": "a batch's rows are answered by its queue; its few uploads' 429s are the rate_limited row"}),
    # issue 40 item 5: Ctrl-C (the terminal's SIGINT to the whole process group) says so in every mode too
    Fault("ctrl_c", 130, "interrupted",
          lambda mode, cell, port: Arrangement(stub={"latency_ms": 300}, budget=1.0,
                                               resume=("calls.max_cost_usd=1",)),
          _sent, driver="ctrl_c", slow=True),
]


def table() -> str:
    """The matrix as the test module's docstring shows it: each cell's exit code, N/A, or xfail."""
    from faults.modes import MODES

    def cell(fault: Fault, mode: str) -> str:
        if mode in fault.na:
            return "N/A"
        code = "killed" if fault.exit < 0 else str(fault.exit)
        return f"{code} xfail" if mode in fault.pending else f"{code} flaky" if mode in fault.flaky else code

    rows = ["| fault | " + " | ".join(MODES) + " |", "|---" * (len(MODES) + 1) + "|"]
    rows += [f"| {f.name} | " + " | ".join(cell(f, m) for m in MODES) + " |" for f in FAULTS]
    return "\n".join(rows)
