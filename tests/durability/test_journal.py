"""The journal trusts only whole records: a line that parses as JSON but is not a record is skipped with a warning,
like a torn line, and never replaces a good record; the printed counts, metrics.json and MLflow then agree."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from helpers.cli_runner import job_dirs, read_jsonl, run_job
from helpers.tracking_runs import job_command, only_run, store_uri

from cupid_exp.durability.journal import Journal, whole_record
from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.inprocess import InProcessModel

N = 4
CALLS_PER_INSTANCE = 4


def _record(key: str, **extra) -> dict:
    return {"key": key, "persona_id": key.split("/")[0], "instance_type": "t", "gt_preference": "p",
            "gt_checklist": ["a"], "gt_checklist_len": 1, "context_factor": "f", "n_context_sessions": 8,
            "relevant_positions": [1], "n_prior_sessions": 8, "history_words": 10, "errors": [], "raw": {},
            "usage": {}, **extra}


def test_a_line_that_is_not_a_whole_record_is_skipped_and_never_replaces_a_good_one(tmp_path: Path, caplog) -> None:
    path = tmp_path / "journal.jsonl"
    good = _record("p1/a", inferred_preference="x")
    lines = [good, {"key": "p1/a"}, _record("p2/a"), {**_record("p2/a"), "errors": "none"}, ["p3/a"], {"key": "p3/a"},
             {**_record("p4/a"), "errors": [{"step": "infer"}]}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with caplog.at_level(logging.WARNING):
        done = Journal(path).load()
    assert done == {"p1/a": good, "p2/a": _record("p2/a")}  # neither p3 nor p4 is finished: they run again
    skipped = [r.getMessage() for r in caplog.records if "not a whole record" in r.getMessage()]
    assert len(skipped) == 5 and "missing persona_id" in skipped[0] and "wrong type for errors" in skipped[1]
    assert whole_record(good) is None and "its kind" in whole_record(lines[-1])



GARBAGE = b"\x00\x17not a record\xff\n" * 20 + b"\x00" * 300  # a block of NULs, as a crash can leave


def test_a_journal_without_one_whole_record_is_set_aside_and_its_instances_run_again(tmp_path: Path, caplog) -> None:
    """Garbage is not cut as if it were a torn line: the file is renamed aside (one warning naming it and where it
    went), the load finds nothing finished, and the next append starts a new journal."""
    path = tmp_path / "journal.jsonl"
    path.write_bytes(GARBAGE)
    with caplog.at_level(logging.WARNING):
        journal = Journal(path)
        assert journal.load() == {}
    (aside,) = tmp_path.glob("journal.jsonl.corrupt-*")
    assert aside.read_bytes() == GARBAGE and not path.exists()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"journal {path} is unreadable (21 line(s), not one a whole record): set aside as "
                           f"{aside.name}; its instances run again"), line
    journal.append(_record("p1/a"))
    assert Journal(path).load() == {"p1/a": _record("p1/a")}


def test_one_whole_record_keeps_the_journal_in_place(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(GARBAGE + b"\n" + json.dumps(_record("p1/a")).encode() + b"\n")
    assert list(Journal(path).load()) == ["p1/a"] and not list(tmp_path.glob("*.corrupt-*"))

def test_a_partial_record_in_the_journal_neither_hides_nor_fakes_an_instance(tmp_path: Path) -> None:
    """The CLI on the stub: a record replaced by ``{"key": ...}`` is run again, one followed by it stands; the
    rerun's printed counts, metrics.json and the MLflow run agree, and it completes."""
    data = write_dataset(tmp_path / "data.jsonl", N)
    root = tmp_path / "out"
    with InProcessModel(latency_ms=1) as stub:
        cmd = job_command(stub, root, data)
        run_job(cmd, timeout=240)
        (journal,) = (root / "journal").glob("*.jsonl")
        records = read_jsonl(journal)
        assert len(records) == N and not any(r["errors"] for r in records)
        lost, kept = records[0]["key"], records[1]["key"]
        # the first record replaced by a partial line; a partial line after the second one
        lines = [{"key": lost}, *records[1:], {"key": kept}]
        journal.write_text("".join(json.dumps(r) + "\n" for r in lines))
        before = stub.stats()["total_received"]
        # a cold response cache: what the rerun calls reaches the stub
        rerun = run_job(job_command(stub, root, data, cache_dir=tmp_path / "cold"), timeout=240)
        assert stub.stats()["total_received"] - before == CALLS_PER_INSTANCE  # only the lost instance again
    out = rerun.stdout + rerun.stderr
    assert "not a whole record" in out and f"resuming: {N - 1} of {N}" in out and "INCOMPLETE" not in out
    saved = json.loads((job_dirs(root)[-1] / "metrics.json").read_text())
    assert saved["complete"] and saved["failed_instances"] == 0 and saved["metrics"]["instances/total"] == N
    run = only_run(store_uri(root)).data
    assert run.tags["cupid.complete"] == "true" and run.metrics["instances/total"] == N
    assert {r["key"] for r in read_jsonl(job_dirs(root)[-1] / "instances.jsonl")} == {r["key"] for r in records}


def test_a_journal_of_one_torn_line_is_cut_as_before_not_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(json.dumps(_record("p1/a")).encode()[:40])  # a kill during the first append
    assert Journal(path).load() == {} and path.read_bytes() == b"" and not list(tmp_path.glob("*.corrupt-*"))


def test_an_append_leaves_its_fsync_to_a_thread_and_sync_waits_for_it(tmp_path: Path, monkeypatch) -> None:
    """An fsync is milliseconds of disk wait: on the event loop it stalled every call in flight once per instance.
    The line is written at once (a kill cannot lose it) and fsynced by a thread, which ``sync`` waits for."""
    import os
    import threading

    fsyncs: list[tuple[int, int]] = []  # (thread, the file's size then)
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: fsyncs.append((threading.get_ident(), os.fstat(fd).st_size))
                        or real(fd))
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    for i in range(20):
        journal.append(_record(f"p{i}/a"))
        assert path.read_bytes().endswith(b"\n")  # whole, before the append returned
    assert all(thread != threading.get_ident() for thread, _ in fsyncs)  # none on the appending thread
    journal.sync()
    assert fsyncs and fsyncs[-1][1] == path.stat().st_size and len(fsyncs) <= 20  # the last covered every line
    assert len(Journal(path).load()) == 20


def test_a_failed_fsync_stops_the_next_append_naming_the_journal(tmp_path: Path, monkeypatch) -> None:
    import errno
    import os

    import pytest

    from cupid_exp.outputs import EnvironmentFailure

    def failing(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a full disk found at the fsync (NFS, quotas)

    monkeypatch.setattr(os, "fsync", failing)
    journal = Journal(tmp_path / "journal.jsonl")
    journal.append(_record("p1/a"))
    journal.sync()  # returns: the failure is kept for the next append
    with pytest.raises(EnvironmentFailure, match="journal.jsonl"):
        journal.append(_record("p2/a"))
