"""A provider's Batch API behind the same ``complete`` call: half price, hours of latency, resumable (docs/batch.md).
Batches and rows are journalled (``BatchLedger``) before they are awaited and identical requests share a row, so
nothing is paid twice; failed rows retry in later batches, and upload and creation follow the live retry policy."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Coroutine, TypeVar

from cupid_exp.llm.batch_ledger import BatchLedger, request_digest
from cupid_exp.llm.batch_limits import EnqueuedTokens, batch_errors, token_limit_rejection
from cupid_exp.llm.limits import estimated_tokens
from cupid_exp.llm.pools import PROBE_BASE_S, PROBE_CAP_S
from cupid_exp.llm.retry import is_outage_failure
from cupid_exp.llm.usage import BatchCounts

if TYPE_CHECKING:
    from litellm.types.utils import LiteLLMBatch

_T = TypeVar("_T")

log = logging.getLogger(__name__)

FINAL_STATES = ("completed", "failed", "expired", "cancelled")
RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504}


@dataclass(frozen=True)
class BatchSettings:
    size: int = 1000  #: rows per batch at most (OpenAI takes up to 50,000)
    delay_s: float = 5.0  #: how long the first waiting request waits for more before its batch is sent
    poll_s: float = 30.0  #: seconds between two status checks of a batch
    max_resubmits: int = 3  #: times a row is sent again after a retryable failure


@dataclass
class _Row:
    digest: str
    body: dict[str, Any]
    future: asyncio.Future[dict[str, Any]]  # the row's reply body
    resubmits: int = 0
    tokens: int = 0  #: its prompt's estimated tokens (the enqueued-token limit)
    paid: bool = False  #: its reply was handed to a caller, who pays for it (the others sharing it do not)
    unread: int = 0  #: times it was answered (billed) in an output line that could not be read


@dataclass
class RowBill:
    """What a call pays for its row (filled in also when it fails): nothing when ``free`` (kept, or paid by an identical
    call); else its reply and the billed attempts whose output line was unreadable (``unread``)."""

    free: bool = False
    unread: int = 0


@dataclass
class Guard:
    """How upload and creation meet refusals: the client's retry policy (``run``) and its stop for later (``later``)."""

    run: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]] = lambda send: send()
    later: Callable[[str, str], Exception] = lambda kind, message: RowFailed(429, kind, message)
    patience_s: float = 1800.0
    outage_patience_s: float = 900.0  #: how long polling waits for an endpoint that stopped answering


class _Gone(Exception):
    """The endpoint did not answer within ``calls.outage_patience_s``: ``stop`` is the job's stop for later."""

    def __init__(self, stop: Exception):
        self.stop = stop
        super().__init__(str(stop))


class RowFailed(Exception):
    """One row's failure, with the HTTP status (or the batch's code) a live call would have seen."""

    def __init__(self, status: int | None, code: str | None, message: str):
        self.status, self.code = status, code
        super().__init__(message)


class Batcher:
    """One endpoint's batches for one job (one event loop): gathers, submits, polls, resolves."""

    def __init__(self, endpoint: dict[str, Any], call_kwargs: dict[str, Any], ledger: BatchLedger,
                 settings: BatchSettings, counts: BatchCounts, guard: Guard):
        self.endpoint, self.kwargs, self.ledger, self.settings, self.counts, self.guard = (
            endpoint, call_kwargs, ledger, settings, counts, guard)
        self.queue = EnqueuedTokens()
        self._waiting: dict[str, _Row] = {}
        self._intake: list[_Row] = []
        self._timer: asyncio.Task[Any] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._adopted = False
        self.loop = asyncio.get_running_loop()
        self._open: set[str] = set()  # the request digests an open batch (an earlier run's) holds

    async def complete(self, body: dict[str, Any], bill: RowBill) -> dict[str, Any]:
        """The reply body for ``body``; ``bill``: what it costs this caller (the first identical caller pays)."""
        digest = request_digest(self.endpoint, body)
        kept = self.ledger.kept(digest)
        if kept is not None:
            self.counts.rows_reused += 1
            bill.free = True
            return kept
        row = self._waiting.get(digest)
        if row is None:
            row = _Row(digest, body, asyncio.get_running_loop().create_future(),
                       tokens=estimated_tokens(body.get("messages") or [], None))
            self._waiting[digest] = row
            if not self._adopt(digest):
                self._intake.append(row)
                self._schedule()
        try:
            reply = await asyncio.shield(row.future)
        except Exception:
            _pay(row, bill)
            raise
        _pay(row, bill)
        self.counts.rows_shared += bill.free
        return reply

    # ---- gathering and sending

    def _adopt(self, digest: str) -> bool:
        """True when an earlier run's open batch holds ``digest``: await it, not resend. Reads the ledger once."""
        if not self._adopted:
            self._adopted = True
            for batch_id, entry in self.ledger.open_batches().items():
                if (entry.get("api_base"), entry.get("model")) == (self.endpoint.get("api_base"),
                                                                   self.endpoint.get("model")):
                    self._open.update(entry["rows"].values())
                    self._watch(batch_id, entry["rows"])
        return digest in self._open

    def _schedule(self, delay_s: float | None = None) -> None:
        if delay_s is None and len(self._intake) >= self.settings.size and self.queue.limit is None:
            self._spawn(self._send(self._take()))
        elif self._timer is None or self._timer.done():
            self._timer = self._spawn(self._send_after_delay(self.settings.delay_s if delay_s is None else delay_s))

    def _take(self) -> list[_Row]:
        """The next batch: up to ``size`` rows, under the enqueued-token limit once known."""
        n = self.queue.fitting([row.tokens for row in self._intake[: self.settings.size]])
        rows, self._intake = self._intake[:n], self._intake[n:]
        return rows

    async def _send_after_delay(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        while rows := self._take():
            await self._send(rows)

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> asyncio.Task[object]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(self._failed)
        return task

    def _failed(self, task: asyncio.Task[Any]) -> None:
        """A sending or polling task raised: every waiting call gets its exception rather than waiting for ever."""
        if task.cancelled() or task.exception() is None:
            return
        for row in [*self._waiting.values(), *self._intake]:
            self._fail(row, task.exception())  # type: ignore[arg-type]
        self._intake = []

    async def _send(self, rows: list[_Row]) -> None:
        import litellm

        lines = [{"custom_id": row.digest[:40], "method": "POST", "url": "/v1/chat/completions", "body": row.body}
                 for row in rows]
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        try:  # a refusal here means what it means to a live call (``Guard``)
            uploaded = await self.guard.run(lambda: litellm.acreate_file(file=("cupid-batch.jsonl", data),
                                                                         purpose="batch", **self.kwargs))
            batch = await self.guard.run(lambda: litellm.acreate_batch(
                completion_window="24h", endpoint="/v1/chat/completions", input_file_id=uploaded.id, **self.kwargs))
        except Exception as exc:  # noqa: BLE001  # the rows' callers sort provider failures from bugs
            for row in rows:
                self._fail(row, exc)
            return
        mapping = {row.digest[:40]: row.digest for row in rows}  # each line's custom_id: its row
        self.queue.in_flight[batch.id] = sum(row.tokens for row in rows)
        self.ledger.submitted(batch.id, self.endpoint, uploaded.id, mapping)
        self.counts.submitted += 1
        self.counts.rows_submitted += len(rows)
        self.counts.ids.append(batch.id)
        log.info("batch %s submitted: %d requests", batch.id, len(rows))
        self._watch(batch.id, mapping)

    # ---- waiting and collecting

    def _watch(self, batch_id: str, rows: dict[str, str]) -> None:
        self.counts.pending += 1
        self._spawn(self._poll(batch_id, rows))

    async def _poll(self, batch_id: str, rows: dict[str, str]) -> None:
        import litellm

        failures = 0
        try:
            while True:
                try:
                    batch = await self._answered(lambda: litellm.aretrieve_batch(batch_id=batch_id, **self.kwargs))
                except _Gone:
                    raise
                except Exception as exc:  # noqa: BLE001
                    failures += 1
                    if failures >= 10:  # a batch whose status cannot be read: its rows fail, the run goes on
                        self._fail_rows(rows, exc)
                        return
                    await asyncio.sleep(min(self.settings.poll_s, 2.0 ** failures))
                    continue
                failures = 0
                if batch.status in FINAL_STATES:
                    await self._collect(batch, rows)
                    return
                await asyncio.sleep(self.settings.poll_s)
        except _Gone as gone:  # the endpoint did not come back: the rows' calls get the job's stop for later
            self._fail_rows(rows, gone.stop)
        finally:
            self.counts.pending -= 1

    def _fail_rows(self, rows: dict[str, str], exc: BaseException) -> None:
        """Every call still waiting on one of ``rows`` gets ``exc``."""
        for digest in rows.values():
            if digest in self._waiting:
                self._fail(self._waiting[digest], exc)

    async def _answered(self, send: Callable[[], Awaitable[_T]]) -> _T:
        """``send()`` until the endpoint answers, outages waited out with capped backoff (a line at start and end); past
        ``calls.outage_patience_s`` raises ``_Gone``."""
        down, tries = None, 0
        where = self.endpoint.get("api_base") or self.endpoint["model"]
        while True:
            try:
                answer = await send()
            except Exception as exc:  # noqa: BLE001  # anything but an outage is the caller's to sort
                if not is_outage_failure(exc):
                    raise
                now = time.time()
                down = down or now
                if now - down > self.guard.outage_patience_s:
                    raise _Gone(self.guard.later("unreachable", (
                        f"provider {where} has not answered since {time.strftime('%H:%M:%S', time.localtime(down))} "
                        f"({now - down:.0f} s, calls.outage_patience_s={self.guard.outage_patience_s:g}): "
                        + " ".join(str(exc).split())[:300]))) from exc
                wait = min(self.settings.poll_s, PROBE_BASE_S * 2 ** tries, PROBE_CAP_S)
                if tries == 0:
                    log.warning("provider %s unreachable since %s; waiting, next try in %.1f s", where,
                                time.strftime("%H:%M:%S", time.localtime(down)), wait)
                tries += 1
                await asyncio.sleep(wait)
                continue
            if down is not None:
                log.warning("provider %s answers again after %.0f s; polling resumed", where, time.time() - down)
            return answer

    async def _read(self, file_id: str | None) -> tuple[list[dict[str, Any]], int]:
        """A result file's entries, and how many of its lines could not be read."""
        import litellm

        if not file_id:
            return [], 0
        content = await self._answered(lambda: litellm.afile_content(file_id=file_id, **self.kwargs))
        out, unread = [], 0
        for line in content.content.decode("utf-8", "replace").splitlines():
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if not isinstance(entry, dict) or "custom_id" not in entry:
                    raise ValueError("no custom_id")
            except ValueError:
                unread += 1
                continue
            out.append(entry)
        return out, unread

    async def _collect(self, batch: LiteLLMBatch, rows: dict[str, str]) -> None:
        answered: set[str] = set()
        rejection = token_limit_rejection(batch) if batch.status == "failed" else None
        if rejection is not None:
            self._hold(batch.id, rows, *rejection)
        elif batch.status == "failed":
            self.counts.failed += 1
            reason = "; ".join(m for _, m in batch_errors(batch) if m) or "no reason given"
            self._fail_rows(rows, RowFailed(400, "batch_failed", f"batch {batch.id} was rejected: {reason}"))
        else:
            self.counts.expired += batch.status == "expired"
            (output, unread), (errors, unread_errors) = (await self._read(batch.output_file_id),
                                                         await self._read(batch.error_file_id))
            for entry in output + errors:
                if (found := rows.get(entry["custom_id"])) is not None:
                    answered.add(found)
                    self._settle(found, entry)
            missing = [self._waiting[d] for d in set(rows.values()) - answered if d in self._waiting]
            self._resend_missing(batch, missing, unread + unread_errors)
        for digest in rows.values():
            self._open.discard(digest)
        self.counts.collected += 1
        self.ledger.closed(batch.id, batch.status)
        if rejection is None:
            self.queue.finished(batch.id, accepted=batch.status != "failed")
        if self._intake:
            # held after a rejection with none of ours queued: the queue is someone else's; look again later
            self._schedule(self.settings.poll_s if rejection is not None and not self.queue.in_flight else None)

    def _hold(self, batch_id: str, rows: dict[str, str], limit: int | None, message: str) -> None:
        """Requeue a batch the enqueued-token limit refused at the front, unless the limit outlasted the patience."""
        self.counts.held_token_limit += 1
        self.queue.rejected(batch_id, limit)
        held = [self._waiting[d] for d in rows.values() if d in self._waiting]
        if self.queue.held_s() > self.guard.patience_s:
            stop = self.guard.later(
                "token_limit_exceeded", f"the provider's enqueued-token limit has refused this job's batches for "
                f"{self.queue.held_s():.0f} s, more than calls.rate_limit_patience_s={self.guard.patience_s:g}: "
                f"{message}")
            for row in held + self._intake:
                self._fail(row, stop)
            self._intake = []
            return
        log.info("batch %s held: the provider's enqueued-token limit (%s); %d requests wait for earlier batches",
                 batch_id, limit, len(held))
        self.counts.rows_resubmitted += len(held)
        self._intake = held + self._intake

    def _settle(self, digest: str, entry: dict[str, Any]) -> None:
        response = entry.get("response") or {}
        status = response.get("status_code")
        body = response.get("body")
        if status == 200 and isinstance(body, dict) and body.get("choices"):
            if (body["choices"][0] or {}).get("finish_reason") != "length":  # a cut reply is no answer: asked again
                self.ledger.keep(digest, body)
            row = self._waiting.pop(digest, None)
            if row is not None and not row.future.done():
                row.future.set_result(body)
            return
        row = self._waiting.get(digest)
        if row is None:
            return
        error = entry.get("error") or (body or {}).get("error") or {}
        message = (error.get("message") if isinstance(error, dict) else str(error)) or "no reply body"
        code = error.get("code") if isinstance(error, dict) else None
        failure = RowFailed(status, code, f"batch row: {status or code}: {message}")
        if status is None and code == "batch_expired" or status in RETRYABLE_STATUS:
            self._retry_or_fail(row, failure)
        else:
            self._fail(row, failure)

    def _resend_missing(self, batch: LiteLLMBatch, missing: list[_Row], unread: int) -> None:
        """Resend rows neither file answers readably. The ``unread`` lines were billed: as many rows (the largest
        prompts, an upper bound) carry an unread attempt."""
        if unread:
            self.counts.rows_unreadable += unread
            log.warning("batch %s: %d result lines could not be read (answered and billed): their rows go into a "
                        "later batch", batch.id, unread)
        for row in sorted(missing, key=lambda r: -r.tokens)[:unread]:
            row.unread += 1
        if batch.status in ("expired", "cancelled"):
            failure = RowFailed(None, "batch_expired", f"batch {batch.id} {batch.status} before this request ran")
        else:
            failure = RowFailed(502, "missing_row", f"batch {batch.id}: no readable result for this request")
        for row in missing:
            self._retry_or_fail(row, failure)

    def _retry_or_fail(self, row: _Row, failure: RowFailed) -> None:
        if row.resubmits >= self.settings.max_resubmits:
            self._fail(row, failure)
            return
        row.resubmits += 1
        self.counts.rows_resubmitted += 1
        self._intake.append(row)
        self._schedule()

    def _fail(self, row: _Row, exc: BaseException) -> None:
        self._waiting.pop(row.digest, None)
        if not row.future.done():
            row.future.set_exception(exc)

    async def close(self) -> None:
        """Stop polling (the job is over or interrupted): pending batches stay journaled for a rerun."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _pay(row: _Row, bill: RowBill) -> None:
    """The first caller to get the row's outcome pays for it; the others sharing it are told it was free."""
    bill.free, row.paid = row.paid, True
    bill.unread = 0 if bill.free else row.unread
