"""The Batch API path on a full disk: the batch ledger's write that fails (``/dev/full``: ENOSPC on every write)
ends the calls waiting on the batch with the environment's failure naming the file, instead of leaving them
waiting forever (a ``calls.batch=true`` job hung once its disk filled up)."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from types import SimpleNamespace

import pytest

from cupid_exp.llm.batch import Batcher, BatchSettings, Guard, RowBill
from cupid_exp.llm.batch_ledger import BatchLedger
from cupid_exp.llm.usage import BatchCounts
from cupid_exp.outputs import EnvironmentFailure

FULL = Path("/dev/full")

pytestmark = pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full")


def _full_ledger(tmp_path: Path) -> BatchLedger:
    ledger = BatchLedger(tmp_path / "batches")
    ledger._journal = FULL  # every journal line meets a full disk
    ledger.open_batches = dict  # (read, /dev/full is endless zeros) no earlier batch is open
    return ledger


def test_a_batch_journal_line_on_a_full_disk_names_its_file(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentFailure, match=r"environment failure: /dev/full: No space left on device \[ENOSPC\]"):
        _full_ledger(tmp_path).closed("batch_1", "completed")


def test_the_calls_waiting_on_a_batch_the_full_disk_stopped_get_its_failure(tmp_path: Path) -> None:
    async def uploaded(send):  # the upload and the batch's creation succeed; journaling the batch does not
        return SimpleNamespace(id="batch_1")

    async def run() -> list[BaseException | tuple]:
        batcher = Batcher({"model": "openai/stub", "api_base": "http://127.0.0.1:9/v1"}, {}, _full_ledger(tmp_path),
                          BatchSettings(delay_s=0.01, poll_s=0.01), BatchCounts(), Guard(run=uploaded))
        calls = [batcher.complete({"messages": [{"role": "user", "content": str(i)}]}, RowBill()) for i in range(3)]
        try:
            return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
        finally:
            await batcher.close()

    outcomes = asyncio.run(run())
    assert all(isinstance(o, EnvironmentFailure) and o.error.errno == errno.ENOSPC for o in outcomes), outcomes
