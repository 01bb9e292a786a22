"""A deterministic OpenAI-compatible stand-in model on 127.0.0.1, for fault injection and benchmarks.

The server and its command line: replies are ``stub_replies``' (a synthesis step is known by its schema alone, so
synthesis roles pointed here need ``structured_output=true``), faults ``stub_faults``' (chosen by hashes, so arrival
order does not matter), a key's limits ``rate_limits``', the Batch API ``batch_api``'s; every knob is a field of
``stub_config.StubConfig``. What it *bills* (``stats()["billed"]``) is what a provider bills: every request processed
into a reply, a slow one whose client gave up included, never a 429, a 5xx or a refusal; without ``usage``
(``omit_usage``) its tokens are counted with litellm's ``token_counter``, as a client must estimate them.

Counters per step are in ``StubServer.stats()`` and ``GET /stats``. A *gate* (``hold_after``) holds every request
after N completed responses unanswered: the moment to SIGKILL a client with known requests in flight. An *outage*
(``outage_after``, ``outage_s``, ``outage_kind``) leaves every request on every route unanswered for a while.

CLI (for bench/ and manual use)::

    python -m cupid_exp.testing.stub_llm_server --port 8011 --latency-ms 200 --jitter-ms 20 \
        --rate-429 0.1 --rate-500 0.1 --rate-503 0.1 --retry-after 1 --seed 0
    python -m cupid_exp.testing.stub_llm_server --rpm 300 --tpm 400000 --limits-pool key --bucket continuous
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import socket
import struct
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cupid_exp.testing.batch_api import BatchQueue, BatchQueueConfig
from cupid_exp.testing.rate_limits import RATE_LIMIT_STYLES, KeyLimits
from cupid_exp.testing.stub_config import StubConfig, stub_arguments
from cupid_exp.testing.stub_faults import (
    CONTEXT_ERRORS,
    MALFORMED_KINDS,
    answer,
    choose_fault,
    cut_reply,
    error_reply,
    no_completion,
)
from cupid_exp.testing.stub_replies import billed_tokens, classify, completion_body, digest, reply_text

__all__ = ["StubConfig", "StubModel", "StubServer", "main"]


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # the default backlog of 5 drops connections under 32+ concurrent clients

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (killed, interrupted) is what real servers shrug off; anything else is printed."""
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


@dataclass
class _InFlight:
    """Requests in flight now, at most, and integrated over time (request-seconds) from the first arrival to the last
    arrival or departure (monotonic clock): how fully a client kept the server busy."""

    now: int = 0
    peak: int = 0
    busy: float = 0.0
    first: float | None = None
    last: float | None = None

    def change(self, n: int) -> None:
        at = time.monotonic()
        if self.first is None:
            self.first = at
        elif self.last is not None:
            self.busy += self.now * (at - self.last)
        self.now += n
        self.peak = max(self.peak, self.now)
        self.last = at

    def mean(self) -> float:
        span = (self.last or 0.0) - (self.first or 0.0)
        return self.busy / span if span > 0 else float(self.now)


@dataclass
class _Counters:
    received: Counter = field(default_factory=Counter)
    completed: Counter = field(default_factory=Counter)
    faults: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    flight: _InFlight = field(default_factory=_InFlight)
    held: int = 0
    completed_prompts: Counter = field(default_factory=Counter)  # digest of the request -> completions
    tokens: Counter = field(default_factory=Counter)  # prompt/completion tokens of the completed responses
    billed: Counter = field(default_factory=Counter)  # requests, prompt_tokens, completion_tokens: what was billed
    rate_limit_styles: Counter = field(default_factory=Counter)  # 429s sent, by how they said the wait
    requests: int = 0  # every request on any route (the outage's count)
    outage_unanswered: int = 0  # requests the outage left unanswered (reset, or a proxy's 5xx)
    outage_started: float | None = None  # wall clock
    outage_ended: float | None = None  # ... when the first request after it was answered
    early_retries: int = 0  # requests sent again before the wait their 429 asked for was over

    def answered(self, step: str, request_digest: str, usage: dict[str, int]) -> None:
        """A completion of ``step`` reached its client (the caller holds its lock): counted, with its tokens."""
        self.completed[step] += 1
        self.completed_prompts[request_digest] += 1
        self.tokens.update({k: usage[k] for k in ("prompt_tokens", "completion_tokens")})

    def stats(self) -> dict[str, Any]:
        """What the HTTP stub and the in-process model both count (the caller holds its lock)."""
        return {"received": dict(self.received), "completed": dict(self.completed),
                "faults": {k: dict(v) for k, v in self.faults.items()},
                "total_received": sum(self.received.values()), "total_completed": sum(self.completed.values()),
                "in_flight": self.flight.now, "peak_in_flight": self.flight.peak,
                "mean_in_flight": round(self.flight.mean(), 2),
                "repeated_completions": sum(n - 1 for n in self.completed_prompts.values() if n > 1),
                "distinct_completed": len(self.completed_prompts), "tokens": dict(self.tokens),
                "billed": {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, **self.billed},
                "rate_limited": sum(f.get("429", 0) for f in self.faults.values())}


class StubModel:
    """What the HTTP stub and the in-process model share: the knobs, the counters, a request's arrival and its bill."""

    def __init__(self, config: StubConfig | None, overrides: dict[str, Any]):
        self.config = config or StubConfig()
        self.config.set(**overrides)
        self._lock = threading.Lock()
        self._seen: Counter = Counter()
        self.counters = _Counters()
        self.bodies: list[dict[str, Any]] = []  # request bodies, when ``record_bodies`` is on

    def _arrive(self, body: dict[str, Any]) -> tuple[str, str, int, float]:
        """Count a request (the caller holds the lock); its step, its prompt's digest, how many times that prompt
        came before, and the latency it waits (its jitter drawn by hash, as the faults are)."""
        if self.config.wire.record_bodies:
            self.bodies.append(body)
        step, prompt_digest = classify(body), digest(json.dumps(body.get("messages"), sort_keys=True))
        self.counters.received[step] += 1
        self.counters.flight.change(1)
        attempt = self._seen[prompt_digest]
        self._seen[prompt_digest] += 1
        cfg, jitter = self.config, 0.0
        if cfg.wire.jitter_ms:
            jitter = random.Random(f"{cfg.seed}:{prompt_digest}:{attempt}").uniform(0, cfg.wire.jitter_ms)
        return step, prompt_digest, attempt, (cfg.wire.latency_ms + jitter) / 1000

    def _billed(self, body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        """``reply`` as sent (without usage under ``omit_usage``), its tokens counted as billed."""
        if self.config.wire.omit_usage:
            reply = {k: v for k, v in reply.items() if k != "usage"}
        prompt, completion = billed_tokens(body, reply)
        with self._lock:
            self.counters.billed.update(requests=1, prompt_tokens=prompt, completion_tokens=completion)
        return reply


class StubServer(StubModel):
    """The stand-in model. Use as a context manager (a background thread) or via ``serve_forever``."""

    def __init__(self, config: StubConfig | None = None, *, port: int = 0, batch: BatchQueueConfig | None = None,
                 **overrides: Any):
        super().__init__(config, overrides)
        self._gate = threading.Condition(self._lock)
        self._hold_after: int | None = None
        self._releases = 0
        self._not_before: dict[str, float] = {}  # prompt digest -> when the wait its last 429 asked for is over
        self.header_values: dict[str, Counter] = defaultdict(Counter)  # header -> values, for ``record_headers``
        self.batches = BatchQueue(self._batch_row, batch, self.fault_reply)  # OpenAI's Files and Batch endpoints
        self.limits = self._key_limits()
        self.httpd = _HTTPServer(("127.0.0.1", port), self._handler())

    def _key_limits(self) -> KeyLimits:
        c = self.config.limits
        return KeyLimits(c.rpm, c.tpm, c.closed_s, c.refuse, pool=c.limits_pool, headers=c.limit_headers,
                         bucket=c.bucket)

    def fault_reply(self, kind: str, prompt_digest: str = "") -> tuple[int, dict[str, Any], dict[str, str]]:
        """(status, body, headers) of a 429, a 500 or a 503 (``stub_faults.error_reply``); a 429 is said in the
        ``rate_limit_style`` (``rotate``: each in turn), counted by style, and remembers when the wait it asked for
        ends (a request for the same prompt before then is an early retry). The Batch API's upload faults too."""
        style = self.config.faults.rate_limit_style if kind == "429" else ""
        with self._lock:
            if style == "rotate":
                style = RATE_LIMIT_STYLES[sum(self.counters.rate_limit_styles.values()) % len(RATE_LIMIT_STYLES)]
            if style:
                self.counters.rate_limit_styles[style] += 1
            status, payload, headers, asked = error_reply(kind, self.config, style)
            if style and prompt_digest:
                self._not_before[prompt_digest] = time.time() + asked
        return status, payload, headers

    # ---- control

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def reset(self) -> None:
        with self._lock:
            self.counters = _Counters()
            self._seen = Counter()
            self._not_before = {}
            self.limits = self._key_limits()

    def reconfigure(self, config: StubConfig | None = None, **changes: Any) -> None:
        """Switch faults on or off between two runs: ``config`` instead (or these fields changed), the key's limits
        made again; the counters (what was billed included) are kept."""
        with self._lock:
            self.config = config or self.config
            self.config.set(**changes)
            self.limits = self._key_limits()

    def hold_after(self, n_completed: int | None) -> None:
        """Once ``n_completed`` responses have completed in total, hold every later request unanswered."""
        with self._gate:
            self._hold_after = n_completed
            if n_completed is None:
                self._releases += 1  # wakes exactly the requests held so far, even if the gate closes again
            self._gate.notify_all()

    def release(self, timeout: float = 10.0) -> None:
        """Open the gate and wait until every held request has left it (so the next gate starts clean)."""
        self.hold_after(None)
        with self._gate:
            self._gate.wait_for(lambda: not self.counters.held, timeout)

    def wait_held(self, timeout: float) -> bool:
        """True once the gate is closed and at least one request waits at it."""
        with self._gate:
            return self._gate.wait_for(lambda: self.counters.held > 0, timeout)

    def _outage(self, handler: Any) -> bool:
        """Whether this request falls in the outage (``outage_after``, ``outage_s``): then it is left unanswered
        as ``outage_kind`` says (the connection reset, or a proxy's 502/503/504 page)."""
        with self._lock:
            c, cfg = self.counters, self.config
            c.requests += 1
            if not cfg.limits.outage_s or (c.outage_started is None and c.requests <= cfg.limits.outage_after):
                return False
            now = time.time()
            c.outage_started = c.outage_started or now
            if now - c.outage_started >= cfg.limits.outage_s:
                c.outage_ended = c.outage_ended or now
                return False
            c.outage_unanswered += 1
        handler.close_connection = True
        if cfg.limits.outage_kind == "reset":  # closed with a RST: the client sees its connection reset, no answer
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            status = int(cfg.limits.outage_kind)
            handler._send(status, f"<html><body><h1>{status} {'Bad Gateway' if status == 502 else 'Unavailable'}"
                                  f"</h1></body></html>".encode(), "text/html")
        return True

    def stats(self) -> dict[str, Any]:
        with self._lock:
            c = self.counters
            return {**c.stats(), "held": c.held, "rate_limit_styles": dict(c.rate_limit_styles),
                    "early_retries": c.early_retries, "limits_ideal_s": self.limits.ideal_s,
                    "outage": {"unanswered": c.outage_unanswered, "started": c.outage_started,
                               "ended": c.outage_ended}}

    def __enter__(self) -> "StubServer":
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _batch_row(self, body: dict[str, Any]) -> dict[str, Any]:
        """A batch row's reply: what a live call with the same body gets (without live faults)."""
        step = classify(body)
        text, finish = reply_text(step, body, self.config), "stop"
        cut = cut_reply(self.config, step, body, text)
        with self._lock:
            self.counters.completed[step] += 1
            if cut is not None:  # a row that ran into max_tokens, as live
                text, finish = cut, "length"
                self.counters.faults[step]["length"] += 1
        return self._billed(body, completion_body(text, body, finish))

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.0: each connection closed after its reply, as some servers and proxies do (``close_connections``)
            protocol_version = "HTTP/1.0" if server.config.wire.close_connections else "HTTP/1.1"
            disable_nagle_algorithm = True  # else headers and body in two writes stall ~40 ms on delayed ACKs

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: Any, content_type: str = "application/json",
                      headers: dict[str, str] | None = None) -> bool:
                """Send ``payload``: bytes as they are, anything else as JSON."""
                if not isinstance(payload, bytes):
                    payload = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", content_type)
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    self.wfile.flush()
                    return True
                except OSError:  # the client gave up (timeout) or was killed
                    self.close_connection = True
                    return False

            def _batch_api(self, method: str, raw: bytes) -> bool:
                routed = server.batches.route(method, self.path, self.headers, raw)
                if routed is None:
                    return False
                status, payload, *headers = routed  # bytes: a file's content
                kind = "application/octet-stream" if isinstance(payload, bytes) else "application/json"
                self._send(status, payload, kind, headers=headers[0] if headers else None)
                return True

            def do_GET(self) -> None:  # noqa: N802
                path = self.path.rstrip("/")
                if path in ("/stats", "/health"):
                    self._send(200, server.stats())
                elif server._outage(self) or self._batch_api("GET", b""):
                    return
                elif path in ("/v1/models", "/models"):
                    # and the connection closed: a client that lists models and then forks workers (the official
                    # runner does) would leave one keep-alive socket shared by all of them, and the responses
                    # read by the wrong process (requests that hang until the client's 600 s timeout)
                    self.close_connection = True
                    self._send(200, {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "stub"}
                                                                 for m in server.config.wire.model_ids]},
                               headers={"connection": "close"})
                else:
                    self._send(404, b'{"error": {"message": "not found"}}')

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                if self.path.rstrip("/") == "/reset":
                    server.reset()
                    self._send(200, b"{}")
                    return
                if server._outage(self):
                    return
                if self._batch_api("POST", raw):
                    return
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    self._send(400, b'{"error": {"message": "invalid JSON body"}}')
                    return
                with server._lock:
                    for name in server.config.wire.record_headers:
                        if (value := self.headers.get(name)) is not None:
                            server.header_values[name.lower()][value] += 1
                server._serve(self, body, raw, self.headers.get("authorization", ""))

        return Handler

    def _serve(self, handler: BaseHTTPRequestHandler, body: dict[str, Any], raw: bytes, auth: str = "") -> None:
        cfg = self.config
        request_digest = digest(raw.decode("utf-8", "replace"))
        with self._gate:
            step, prompt_digest, attempt, delay = self._arrive(body)
            if time.time() < self._not_before.get(prompt_digest, 0.0) - 0.05:  # 50 ms for clocks and transit
                self.counters.early_retries += 1
        try:
            if self.limits.active and (verdict := self.limits.check(body)) is not None:  # answered at once
                with self._lock:
                    self.counters.faults[step][verdict.kind] += 1
                handler._send(verdict.status, verdict.body, headers=verdict.headers)
                return
            if delay > 0:
                time.sleep(delay)
            fault = choose_fault(cfg, step, prompt_digest, attempt, body)
            if fault is None or fault == "malformed" or fault in MALFORMED_KINDS:
                # a reply about to complete waits at a closed gate
                with self._gate:
                    if self._hold_after is not None and sum(self.counters.completed.values()) >= self._hold_after:
                        self.counters.held += 1
                        self._gate.notify_all()
                        released = self._releases
                        self._gate.wait_for(lambda: self._releases != released)
                        self.counters.held -= 1
                        self._gate.notify_all()
                        handler.close_connection = True
                        return  # released: the client is gone; answer nothing
            if fault is not None:
                with self._lock:
                    self.counters.faults[step][fault] += 1
                self._send_fault(handler, fault, body, auth, prompt_digest)
                return
            full, cut = answer(cfg, step, body)
            if cut:  # a reply that ran into max_tokens
                with self._lock:
                    self.counters.faults[step]["length"] += 1
            reply = self._billed(body, full)  # processed: billed even if the client has gone
            stated = self.limits.stated(body) if self.limits.active else None
            if handler._send(200, reply, headers=stated):  # type: ignore[attr-defined]
                with self._lock:
                    self.counters.answered(step, request_digest, full["usage"])
        finally:
            with self._lock:  # answered, failed or abandoned: no longer in flight
                self.counters.flight.change(-1)

    def _send_fault(self, handler: Any, fault: str, body: dict[str, Any], auth: str, prompt_digest: str) -> None:
        """Answer with ``fault`` as a provider would, billing what is processed (429s and 5xx: ``fault_reply``)."""
        cfg = self.config
        if fault == "echo_key":  # some providers quote the key they rejected (or, in a 400, the request's fields)
            key = auth.removeprefix("Bearer ").strip()
            rejected = cfg.replies.echo_key_status == 401
            handler._send(cfg.replies.echo_key_status, {"error": {
                "message": f"Incorrect API key provided: {key}." if rejected else f"Invalid request from key {key}.",
                "type": "invalid_request_error", "code": "invalid_api_key" if rejected else None}})
        elif fault in ("429", "500", "503"):
            status, payload, headers = self.fault_reply(fault, prompt_digest)
            handler._send(status, payload, headers=headers)
        elif fault == "slow":  # processed (and billed) after the client's timeout
            time.sleep(cfg.faults.slow_s)
            handler._send(200, self._billed(body, completion_body("too late", body)))
        elif fault in ("empty_choices", "content_null"):
            handler._send(200, self._billed(body, no_completion(fault, body)))
        elif fault == "context_length":
            status, payload = CONTEXT_ERRORS[cfg.replies.context_error or "openai"]
            handler._send(status, payload)
        elif fault == "malformed" or fault in MALFORMED_KINDS:
            full = json.dumps(completion_body(reply_text(classify(body), body, cfg), body)).encode()
            kind = fault if fault in MALFORMED_KINDS else MALFORMED_KINDS[int(digest(full.decode())[:2], 16)
                                                                          % len(MALFORMED_KINDS)]
            if kind == "truncated":
                handler._send(200, full[: len(full) // 2])
            elif kind == "content_type":
                handler._send(200, b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html")
            else:
                handler._send(200, {"id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": "stub"})


def main(argv: list[str] | None = None) -> None:
    port, cfg = stub_arguments(argv, __doc__.split("\n\n")[0])
    server = StubServer(cfg, port=port)
    print(f"stub LLM server listening on {server.url} ({json.dumps(cfg.knobs())})", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a KeyboardInterrupt: the stats are printed
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.httpd.serve_forever(poll_interval=0.05)
    finally:
        print("stub stats " + json.dumps(server.stats()), file=sys.stderr, flush=True)
        server.httpd.server_close()


if __name__ == "__main__":
    main()
