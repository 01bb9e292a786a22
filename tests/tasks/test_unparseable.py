"""Unparseable replies, end to end: raw text kept, a bounded re-ask, failures counted per step, and the
failure policy (exclude or zero) applied to the numbers and stated in the printed table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.cli_runner import cli_command, job_dirs, metrics_of, read_jsonl, run_job

from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.inprocess import InProcessModel

pytestmark = pytest.mark.slow

N = 12
REASK = 2


def test_unparseable_decomposer_replies_are_kept_reasked_counted_and_policy_applied(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", N)
    cache = tmp_path / "cache"
    with InProcessModel(garbage_steps=("decompose",), garbage_rate=0.5, seed=5) as stub:
        def run(policy: str):
            root = tmp_path / policy
            proc = run_job(cli_command(stub, root, "tracking=none", f"runtime.reask={REASK}",
                                       f"runtime.failure_policy={policy}", "runtime.max_failed_fraction=1",
                                       cache_dir=cache, data=data))
            (job,) = job_dirs(root)
            return proc, read_jsonl(job / "instances.jsonl"), metrics_of(job)

        proc, records, metrics = run("exclude")
        received = stub.stats()["received"]["decompose"]
        zproc, zrecords, zmetrics = run("zero")
        assert stub.stats()["received"]["decompose"] == received  # same calls: all from the cache

    failed = [r for r in records if r["errors"]]
    ok = [r for r in records if not r["errors"]]
    assert 0 < len(failed) < N, "the stub garbles about half of the decomposer prompts"
    for r in failed:
        assert [(e["step"], e["kind"]) for e in r["errors"]] == [("decompose", "unparseable")]
        assert len(r["raw"]["decompose"]) == 1 + REASK  # exactly 1 + runtime.reask attempts, each kept
        assert all("unusable reply" in text for text in r["raw"]["decompose"])
        assert r["usage"]["decompose"]["calls"] == 1 + REASK
        assert r["inferred_preference"] and r.get("precision") is None
    for r in ok:
        assert len(r["raw"]["decompose"]) == 1 and 0 <= r["f1"] <= 1
    assert received == (1 + REASK) * len(failed) + len(ok)

    # counted per step, and the table states the policy and the counts
    assert metrics["errors/decompose/unparseable"] == len(failed) == zmetrics["errors/decompose/unparseable"]
    assert metrics["calls/failed"] == 0  # an unparseable reply is not a failed call
    assert metrics["calls/unusable_replies"] == REASK * len(failed) + len(failed)
    assert proc.stdout.rstrip().splitlines()[-1].startswith(
        f"INCOMPLETE: {len(failed)} of {N} instances failed (decompose/unparseable={len(failed)})")
    line = f"inference instances: {N} run, {len(ok)} scored, {len(failed)} failed"
    assert f"{line} (policy: exclude)" in proc.stdout and f"{line} (policy: zero)" in zproc.stdout
    assert f"decompose/unparseable={len(failed)}" in proc.stdout

    # the policy changes the numbers: zero scores each failed instance 0 against its full checklist
    mean_p = sum(r["precision"] for r in ok) / len(ok)
    mean_r = sum(r["recall"] for r in ok) / len(ok)
    assert metrics["inference/precision"] == pytest.approx(mean_p)
    assert zmetrics["inference/precision"] == pytest.approx(mean_p * len(ok) / N)
    assert zmetrics["inference/recall"] == pytest.approx(mean_r * len(ok) / N)
    assert metrics["inference/count/scored"] == zmetrics["inference/count/scored"] == len(ok)
    assert zmetrics["inference/n"] == N and metrics["inference/n"] == len(ok)
    excluded_f1 = float(re.search(r"^all\s+\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", proc.stdout, re.M).group(1))
    zero_f1 = float(re.search(r"^all\s+\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", zproc.stdout, re.M).group(1))
    assert excluded_f1 == pytest.approx(100 * metrics["inference/f1"], abs=0.05) and zero_f1 < excluded_f1
    assert [r["key"] for r in zrecords] == [r["key"] for r in records]
