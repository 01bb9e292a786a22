"""The usage ledger: one line per count as it is made, replayed whole on resume; a torn or foreign line costs
only itself; a journal from before the ledger starts it with its finished instances' usage."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from helpers.cli_runner import run_cli
from helpers.processes import children
from helpers.tracking_runs import held_job, job_command, only_run, store_uri

from cupid_exp.durability.attempts import whole_job_usage
from cupid_exp.durability.ledger import UsageLedger
from cupid_exp.llm.usage import Completion, UsageMeter, usage_metrics
from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.stub_llm_server import StubServer


def _meter_into(ledger: UsageLedger) -> UsageMeter:
    meter = UsageMeter(sink=ledger.append)
    meter.add("infer", Completion("a", prompt_tokens=100, completion_tokens=20, cost_usd=0.003))
    meter.add("infer", Completion("a", prompt_tokens=100, completion_tokens=20, cost_usd=0.003, cached=True))
    meter.fail("decompose", "rate_limit", retries=2)
    meter.reject("match", "content_filter")
    meter.add("judge", Completion("7", prompt_tokens=5, completion_tokens=1, cost_usd=None))
    return meter


def test_every_count_is_on_disk_as_it_is_made_and_replays_to_the_same_meter(tmp_path: Path) -> None:
    ledger = UsageLedger.beside(tmp_path / "journal" / "abc.jsonl")
    assert ledger.path == tmp_path / "journal" / "usage" / "abc.jsonl"
    meter = _meter_into(ledger)
    lines = ledger.path.read_text().splitlines()  # written, not buffered: a SIGKILL now loses nothing
    assert len(lines) == 5 and json.loads(lines[0])["cost_usd"] == 0.003
    replayed = UsageLedger(ledger.path).load()
    assert replayed.as_dict() == meter.as_dict()
    assert usage_metrics(replayed) == usage_metrics(meter)


def test_a_torn_last_line_is_cut_and_a_foreign_line_skipped(tmp_path: Path) -> None:
    ledger = UsageLedger(tmp_path / "usage.jsonl")
    meter = _meter_into(ledger)
    with ledger.path.open("ab") as fh:
        fh.write(b'{"key": "not a count"}\n{"step": "infer", "calls": "1"}\n{"step": "infer", "cal')
    again = UsageLedger(ledger.path)
    assert again.load().as_dict() == meter.as_dict()
    again.append("infer", {"calls": 1})  # starts on a line of its own
    assert UsageLedger(ledger.path).load().counts["infer"]["calls"] == meter.counts["infer"]["calls"] + 1



def test_a_ledger_without_one_count_is_set_aside_and_restarted_from_the_journal(tmp_path: Path, caplog) -> None:
    """Garbage (no newline: it would pass for one torn line) is kept aside, not cut away, and the spend starts again
    from what the journal's finished instances used, never from nothing."""
    import logging

    ledger = UsageLedger(tmp_path / "usage.jsonl")
    garbage = b"\x00\x17not a count\xff" * 40
    ledger.path.write_bytes(garbage)
    records = [{"key": "a", "usage": {"infer": {"calls": 2, "cost_usd": 0.5}}}]
    with caplog.at_level(logging.WARNING, logger="cupid_exp.aside"):
        meter = ledger.load(carried=records)
    assert meter.totals()["cost_usd"] == 0.5 and meter.totals()["calls"] == 2
    (aside,) = tmp_path.glob("usage.jsonl.corrupt-*")
    assert aside.read_bytes() == garbage
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"usage ledger {ledger.path} is unreadable (1 line(s), not one a usage count): set aside "
                           f"as {aside.name}"), line
    assert UsageLedger(ledger.path).load().totals()["cost_usd"] == 0.5  # the new ledger holds it

def test_a_journal_from_before_the_ledger_starts_it_once(tmp_path: Path) -> None:
    records = [{"key": "a", "usage": {"infer": {"calls": 2, "prompt_tokens": 10, "completion_tokens": 4,
                                                "cost_usd": 0.5, "cache_hits": 1}}},
               {"key": "b", "usage": {"infer": {"calls": 1, "prompt_tokens": 5, "completion_tokens": 2}}}]
    ledger = UsageLedger(tmp_path / "usage.jsonl")
    earlier = ledger.load(carried=records)
    assert earlier.counts["infer"]["calls"] == 3 and earlier.counts["infer"]["cost_usd"] == 0.5
    assert UsageLedger(ledger.path).load(carried=records).as_dict() == earlier.as_dict()  # carried once only


def test_the_whole_job_is_the_earlier_attempts_and_this_one(tmp_path: Path) -> None:
    ledger = UsageLedger(tmp_path / "usage.jsonl")
    _meter_into(ledger)
    earlier = UsageLedger(ledger.path).load()
    this = UsageMeter()
    this.add("infer", Completion("b", prompt_tokens=1, completion_tokens=1, cost_usd=0.001))
    whole = whole_job_usage(earlier, this)
    assert whole["cost/usd"] == 0.004 and whole["calls/infer"] == 2 and whole["calls/decompose/failed_rate_limit"] == 1
    assert whole["calls/match/content_filter_attempt"] == 1 and whole["calls/unpriced"] == 1
    assert whole_job_usage(None, this) == {}


def _price(tokens: dict) -> float:
    """What the stub's answers cost at helpers.tracking_runs.PRICES (every role priced like gpt-4o)."""
    return tokens.get("prompt_tokens", 0) * 2.5e-06 + tokens.get("completion_tokens", 0) * 1e-05


@pytest.mark.slow
def test_what_an_interrupted_attempt_paid_is_in_the_resumed_runs_cost(tmp_path: Path) -> None:
    """Ctrl-C half-way through a job with two processes, then the same command: the run's cost is every answer
    the stub sent, its earlier attempts' share what the interrupted attempt was sent (and the worst case of each
    request it cut in flight)."""
    n = 8
    data = write_dataset(tmp_path / "data.jsonl", n)
    root = tmp_path / "out"
    with StubServer() as stub:
        cmd = job_command(stub.url, root, data, "model.max_concurrency=2", "runtime.workers=2",
                          "calls.num_retries=0")
        with held_job(stub, cmd, tmp_path / "attempt1.log", after=2 * n) as proc:
            time.sleep(1.5)  # the replies sent before the gate closed are read (their requests are paid)
            for pid in [proc.pid, *children(proc.pid)]:  # as a terminal's Ctrl-C reaches the whole group
                os.kill(pid, signal.SIGINT)
            assert proc.wait(timeout=60) != 0
        interrupted = stub.stats()
        run_cli(cmd, timeout=240)
        paid = stub.stats()
    assert 0 < interrupted["total_completed"] < paid["total_completed"]
    m = only_run(store_uri(root)).data.metrics
    answered = _price(interrupted["tokens"])
    earlier = m["cost/usd/earlier_attempts"]
    # every answer is counted; a request the interrupt cut in flight is charged its worst case where the process
    # that sent it lived to write it down (the provider may have processed and billed it: llm/billing.py)
    assert earlier == pytest.approx(answered, rel=1e-9) or (
        earlier > answered and interrupted["total_received"] > interrupted["total_completed"]), (earlier, answered)
    # the resumed attempt was not interrupted: exactly what it was answered
    assert m["cost/usd"] - earlier == pytest.approx(_price(paid["tokens"]) - answered, rel=1e-6)
    assert paid["total_completed"] <= m["calls/requests"] <= paid["total_received"]
