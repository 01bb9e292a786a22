"""The Batch API's memory on disk (``<calls.cache_dir>/batches``): the batches submitted and every row returned, so a
rerun anywhere with the same folder collects them instead of paying again. An unreadable list is set aside."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from filelock import FileLock

from cupid_exp.aside import set_aside, torn
from cupid_exp.outputs import writing

log = logging.getLogger(__name__)


def request_digest(endpoint: dict[str, Any], body: dict[str, Any]) -> str:
    """What identifies a request across runs: the endpoint (model, api_base) and the whole body."""
    payload = json.dumps({"endpoint": endpoint, "body": body}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


class BatchLedger:
    """Submitted batches and returned rows, on disk, shared by every process using the cache folder."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        (self.root / "rows").mkdir(parents=True, exist_ok=True)
        self._journal = self.root / "batches.jsonl"
        self._lock = FileLock(str(self.root / ".lock"))

    def _append(self, entry: dict[str, Any]) -> None:
        with writing(self._journal), self._lock, self._journal.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")
            fh.flush()

    def submitted(self, batch_id: str, endpoint: dict[str, Any], input_file_id: str, rows: dict[str, str]) -> None:
        """Journal a batch before anyone waits on it: ``rows`` maps custom_id -> request digest."""
        self._append({"batch": batch_id, "model": endpoint.get("model"), "api_base": endpoint.get("api_base"),
                      "input_file_id": input_file_id, "rows": rows, "at": time.time()})

    def closed(self, batch_id: str, status: str) -> None:
        self._append({"batch": batch_id, "closed": status, "at": time.time()})

    def open_batches(self) -> dict[str, dict[str, Any]]:
        """Batches submitted and not yet collected (by anyone): batch id -> its journal entry."""
        out: dict[str, dict[str, Any]] = {}
        if not self._journal.exists():
            return out
        data = self._journal.read_bytes()
        lines, read = data.splitlines(keepends=True), 0
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:  # a torn last line from a killed writer (or bytes that are not text)
                continue
            if not isinstance(entry, dict) or "batch" not in entry:
                continue
            read += 1
            if "closed" in entry:
                out.pop(entry["batch"], None)
            elif isinstance(entry.get("rows"), dict):
                out[entry["batch"]] = entry
        if not read and [line for line in lines if line.strip() and not torn(line)]:
            with self._lock:  # once: another process may have set it aside and begun a new one meanwhile
                if self._journal.exists() and self._journal.read_bytes() == data:
                    set_aside(self._journal, "batch ledger", "not one readable entry",
                              "the batches it named are not collected: their requests are sent again")
        return out

    def _row_path(self, digest: str) -> Path:
        return self.root / "rows" / f"{digest}.json"

    def keep(self, digest: str, body: dict[str, Any]) -> None:
        """A row's reply, written atomically: a later run gets it without paying again."""
        path = self._row_path(digest)
        tmp = path.with_suffix(f".{id(body)}.tmp")
        with writing(path):  # a full disk: one line naming the row's file (exit 5)
            try:
                tmp.write_text(json.dumps(body), encoding="utf-8")
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            tmp.replace(path)

    def kept(self, digest: str) -> dict[str, Any] | None:
        path = self._row_path(digest)
        try:
            row: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            return row
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError):
            log.warning("batch ledger: unreadable reply %s, asked again", path)
            return None
