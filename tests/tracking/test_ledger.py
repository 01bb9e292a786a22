"""The usage ledger: one line per count as it is made, replayed whole on resume; a torn or foreign line costs
only itself; a journal from before the ledger starts it with its finished instances' usage."""

from __future__ import annotations

import json
from pathlib import Path

from cupid_exp.llm.usage import Completion, UsageMeter, usage_metrics
from cupid_exp.tracking.attempts import whole_job_usage
from cupid_exp.tracking.ledger import UsageLedger


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
    assert whole["cost/usd"] == 0.004 and whole["calls/infer"] == 3 and whole["calls/decompose/failed_rate_limit"] == 1
    assert whole["calls/match/content_filter_attempt"] == 1 and whole["calls/unpriced"] == 1
    assert whole_job_usage(None, this) == {}
