"""OpenAI's Files and Batch endpoints in memory, for the stub server: slow, failing, expired and malformed batches,
refused uploads, the enqueued-token limit, garbled lines, and counted submissions."""

from __future__ import annotations

import email.parser
import email.policy
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from cupid_exp.testing.rate_limits import refusal
from cupid_exp.testing.stub_replies import prompt_tokens

Answer = Callable[[dict[str, Any]], dict[str, Any]]  # a request body -> a chat.completion body
FaultReply = Callable[[str], tuple[int, dict[str, Any], dict[str, str]]]  # "429" | "500" | "503" -> a live reply


@dataclass
class BatchQueueConfig:
    complete_after_s: float = 0.5  # how long a batch stays in progress
    row_fail_rate: float = 0.0  # share of rows answered 500 (seeded by the row's body; a retry passes)
    fail_first_rows: int = 0  # every row answered 500 its first N times (by its body): retries, deterministically
    expire_batches: tuple[int, ...] = ()  # 1-based submission numbers that expire instead of completing
    seed: int = 0
    refuse_upload: str = ""  # every upload refused: "401" | "insufficient_quota" | "daily" (rate_limits.REFUSALS)
    enqueued_token_limit: int = 0  # OpenAI's cap on the prompt tokens of the batches in progress; 0: none
    fail_first_uploads: int = 0  # the first N uploads answered as a live request's fault: ...
    upload_fault_kinds: tuple[str, ...] = ("429",)  # ... these kinds in turn ("429", "500", "503")
    garble_rows: float = 0.0  # share of output lines cut in half (seeded by the row and the batch) ...
    garble_runs: int = 1  # ... among a row's first N runs (1: a resend passes)


@dataclass
class _Batch:
    id: str
    input_file_id: str
    created: float
    number: int
    status: str = "validating"
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: dict[str, Any] | None = None
    counts: dict[str, int] = field(default_factory=lambda: {"total": 0, "completed": 0, "failed": 0})
    tokens: int = 0  # its rows' prompt tokens, enqueued while it is in progress
    rejection: dict[str, Any] | None = None  # the errors it fails with at its first look (the enqueued-token limit)


class BatchQueue:
    """Files and batches of one stub server; ``answer`` gives a row's reply as a live call would."""

    def __init__(self, answer: Answer, config: BatchQueueConfig | None, fault_reply: FaultReply):
        self.answer, self.config, self.fault_reply = answer, config or BatchQueueConfig(), fault_reply
        self._lock = threading.Lock()
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, _Batch] = {}
        self.uploads = 0
        self.polls = 0
        self.rows_answered = 0
        self.upload_refusals = 0
        self.upload_faults = 0  # uploads answered with a transient fault (``fail_first_uploads``)
        self.rows_garbled = 0
        self.rows_failed = 0  # rows answered 500
        self._row_seen: dict[str, int] = {}  # a row's body -> times the queue ran it
        self.rows_accepted = 0  # rows of batches the queue took (not rejected for the token limit)

    @property
    def submissions(self) -> int:
        """Batches created (each is kept, a rejected one too)."""
        return len(self.batches)

    @property
    def token_limit_rejections(self) -> int:
        return sum(b.rejection is not None for b in list(self.batches.values()))

    # ---- HTTP routes: (status, JSON body or bytes)

    def route(self, method: str, path: str, headers: Any, raw: bytes) -> tuple[Any, ...] | None:
        """(status, JSON body or bytes[, headers]), or None for a path that is not the Files or Batch API's."""
        path = path.split("?")[0].rstrip("/")
        if method == "POST" and path == "/v1/files" and self.config.refuse_upload:
            with self._lock:
                self.upload_refusals += 1
            return refusal(self.config.refuse_upload, "gpt-4o")
        if method == "POST" and path == "/v1/files" and self.upload_faults < self.config.fail_first_uploads:
            with self._lock:
                kinds = self.config.upload_fault_kinds
                kind = kinds[self.upload_faults % len(kinds)]
                self.upload_faults += 1
            return self.fault_reply(kind)
        if method == "POST" and path == "/v1/files":
            return self._upload(headers.get("content-type", ""), raw)
        if method == "GET" and path.startswith("/v1/files/") and path.endswith("/content"):
            data = self.files.get(path[len("/v1/files/"):-len("/content")])
            return (200, data) if data is not None else _not_found("file")
        if method == "GET" and path.startswith("/v1/files/"):
            file_id = path[len("/v1/files/"):]
            return (200, _file_object(file_id, self.files[file_id])) if file_id in self.files else _not_found("file")
        if method == "POST" and path == "/v1/batches":
            return self._create(json.loads(raw or b"{}"))
        if method == "GET" and path.startswith("/v1/batches/"):
            return self._retrieve(path[len("/v1/batches/"):])
        return None

    def _upload(self, content_type: str, raw: bytes) -> tuple[int, Any]:
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"content-type: " + content_type.encode() + b"\r\n\r\n" + raw)  # the multipart/form-data fields
        fields = {part.get_param("name", header="content-disposition"): part.get_payload(decode=True) or b""
                  for part in message.iter_parts()}
        if fields.get("purpose", b"").decode() != "batch" or "file" not in fields:
            return 400, {"error": {"message": "purpose must be 'batch' and a file given",
                                   "type": "invalid_request_error", "param": "purpose", "code": None}}
        data = fields["file"]
        with self._lock:
            self.uploads += 1
            file_id = "file-" + hashlib.sha256(data + str(self.uploads).encode()).hexdigest()[:24]
            self.files[file_id] = data
        return 200, _file_object(file_id, data)

    def _create(self, body: dict[str, Any]) -> tuple[int, Any]:
        file_id = body.get("input_file_id")
        if file_id not in self.files:
            return _not_found("file")
        if body.get("endpoint") != "/v1/chat/completions" or body.get("completion_window") != "24h":
            return 400, {"error": {"message": "endpoint must be /v1/chat/completions and completion_window 24h",
                                   "type": "invalid_request_error", "param": None, "code": None}}
        tokens, model = _prompt_tokens(self.files[file_id])
        with self._lock:
            now = time.time()
            queued = sum(b.tokens for b in self.batches.values() if b.status in ("validating", "in_progress")
                         and b.rejection is None and now - b.created < self.config.complete_after_s)
            number = len(self.batches) + 1
            batch = _Batch(id=f"batch_{number:04d}_" + file_id[-8:], input_file_id=file_id, created=now,
                           number=number, tokens=tokens)
            limit = self.config.enqueued_token_limit
            if limit and queued + tokens > limit:
                batch.rejection = {"object": "list", "data": [{
                    "code": "token_limit_exceeded", "line": None, "param": None,
                    "message": f"Enqueued token limit reached for {model} in organization org-stub. Limit: "
                               f"{limit:,} enqueued tokens. Please try submitting an input file with fewer tokens, "
                               "or wait for your existing batches to complete."}]}
            self.batches[batch.id] = batch
        return 200, self._object(batch)

    def _retrieve(self, batch_id: str) -> tuple[int, Any]:
        batch = self.batches.get(batch_id)
        if batch is None:
            return _not_found("batch")
        with self._lock:
            self.polls += 1
            if batch.rejection is not None and batch.status == "validating":
                batch.status, batch.errors = "failed", batch.rejection
            elif batch.status in ("validating", "in_progress"):
                age = time.time() - batch.created
                if age >= self.config.complete_after_s:
                    self._finish(batch)
                elif age >= self.config.complete_after_s / 3:
                    batch.status = "in_progress"
        return 200, self._object(batch)

    # ---- the queue's work

    def _finish(self, batch: _Batch) -> None:
        lines = self.files[batch.input_file_id].decode().splitlines()
        try:
            rows = [json.loads(line) for line in lines if line.strip()]
            assert all("custom_id" in r and isinstance(r.get("body"), dict) for r in rows)
        except (ValueError, AssertionError):
            batch.status = "failed"
            batch.errors = {"object": "list", "data": [{"code": "invalid_json_line", "line": None,
                                                        "message": "a line of the input file is not a request"}]}
            return
        batch.counts["total"] = len(rows)
        self.rows_accepted += len(rows)
        expired = batch.number in self.config.expire_batches
        output, errors = [], []
        for row in rows:
            if expired:
                errors.append({"id": "batch_req_" + row["custom_id"], "custom_id": row["custom_id"], "response": None,
                               "error": {"code": "batch_expired",
                                         "message": "This request could not be executed before the completion "
                                                    "window expired."}})
                continue
            body = row["body"]
            key = json.dumps(body, sort_keys=True)
            u = int(hashlib.sha256(f"{self.config.seed}:{batch.number}:{key}".encode()).hexdigest()[:8], 16) / 16 ** 8
            seen = self._row_seen[key] = self._row_seen.get(key, 0) + 1
            if u < self.config.row_fail_rate or seen <= self.config.fail_first_rows:
                self.rows_failed += 1
                response = {"status_code": 500, "request_id": "req_" + row["custom_id"],
                            "body": {"error": {"message": "The server had an error processing your request.",
                                               "type": "server_error", "param": None, "code": None}}}
                batch.counts["failed"] += 1
            else:
                self.rows_answered += 1
                response = {"status_code": 200, "request_id": "req_" + row["custom_id"], "body": self.answer(body)}
                batch.counts["completed"] += 1
            output.append({"id": "batch_req_" + row["custom_id"], "custom_id": row["custom_id"],
                           "response": response, "error": None})
            if u >= 1 - self.config.garble_rows and seen <= self.config.garble_runs:  # answered, billed, unreadable
                self.rows_garbled += 1
                output[-1] = json.dumps(output[-1])[:60]
        batch.status = "expired" if expired else "completed"
        for kind, items in (("output", output), ("error", errors)):
            if items:
                file_id = f"file-{kind}-{batch.id}"
                self.files[file_id] = "".join((i if isinstance(i, str) else json.dumps(i)) + "\n"
                                              for i in items).encode()
                setattr(batch, f"{kind}_file_id", file_id)

    def _object(self, batch: _Batch) -> dict[str, Any]:
        return {"id": batch.id, "object": "batch", "endpoint": "/v1/chat/completions", "errors": batch.errors,
                "input_file_id": batch.input_file_id, "completion_window": "24h", "status": batch.status,
                "output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id,
                "created_at": int(batch.created), "request_counts": dict(batch.counts), "metadata": None}


def _prompt_tokens(data: bytes) -> tuple[int, str]:
    """The prompt tokens of an input file's rows (characters / 4 each, at least 1), and the model they name."""
    tokens, model = 0, "gpt-4o"
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            body = json.loads(line).get("body") or {}
        except (ValueError, AttributeError):
            continue
        tokens += prompt_tokens(body)
        model = str(body.get("model") or model)
    return tokens, model


def _file_object(file_id: str, data: bytes) -> dict[str, Any]:
    return {"id": file_id, "object": "file", "bytes": len(data), "created_at": int(time.time()),
            "filename": "batch.jsonl", "purpose": "batch", "status": "processed"}


def _not_found(what: str) -> tuple[int, Any]:
    return 404, {"error": {"message": f"No such {what}", "type": "invalid_request_error", "param": None,
                           "code": None}}
