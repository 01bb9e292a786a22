"""A deterministic OpenAI-compatible stand-in model on 127.0.0.1, for fault injection and benchmarks.

It is not a model: it recognises which CUPID pipeline step a request belongs to (from the
prompt text, or from the JSON schema in ``response_format``) and returns a well-formed reply
for that step, derived from a hash of the prompt, so the same request always gets the same
answer. Synthesis steps are recognised by their schema alone and answered with JSON built from
that schema (``schema_value``), so synthesis roles pointed at the stub need
``structured_output=true``; the assistant simulator (free text) is recognised by its prompt. Around that it injects what real providers do: latency (fixed or jittered), HTTP 429
with ``retry-after``, 500, 503, responses slower than the client's timeout, malformed bodies
(truncated JSON, a wrong content-type, no ``choices``), context-length errors in the styles
of several providers, unparseable replies for chosen steps, 200s without a completion (``choices: []``, or
``content: null``), replies without ``usage``, a key's refusals (``refuse``: 401/403/404, ``insufficient_quota``,
a daily limit) and the Batch API's (``batch_api.py``).

What it *bills* is counted apart (``stats()["billed"]``), as a provider bills: every request it processed into a
reply, including a slow one whose client had given up and a reply without a completion; never a 429, a 5xx or a
refusal. A reply's tokens are its ``usage``; where it sends none (``omit_usage``), they are counted with litellm's
``token_counter`` (tiktoken), the rule a client must estimate them by.

Fault decisions are deterministic too: they hash (seed, prompt, how many times this prompt
was seen), so a run's faults do not depend on the order in which concurrent requests arrive.

Counters per step (requests received, responses completed, faults by kind) are available
in-process (``StubServer.stats()``) and over HTTP (``GET /stats``). A test can also close a
*gate* after N completed responses: further requests are received but held unanswered until
the gate opens — the moment to SIGKILL a client with a known set of requests in flight.

CLI (for bench/ and manual use)::

    python -m cupid_exp.testing.stub_llm_server --port 8011 --latency-ms 200 --jitter-ms 20 \
        --rate-429 0.1 --rate-500 0.1 --rate-503 0.1 --retry-after 1 --seed 0
    python -m cupid_exp.testing.stub_llm_server --rpm 300 --tpm 400000   # a key's limits (rate_limits.py)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cupid_exp.testing.batch_api import BatchQueue, BatchQueueConfig
from cupid_exp.testing.rate_limits import KeyLimits

STEPS = ("infer", "decompose", "match", "generate", "judge", "summarize", "unknown")
# Synthesis's own steps (its decomposition is evaluation's "decompose").
SYNTHESIS_STEPS = ("persona", "factors", "changed_preference", "session", "user_simulator", "validate",
                   "assistant_simulator")
LABELS = ("Fully Covered", "Partially Covered", "Not Covered")
MALFORMED_KINDS = ("truncated", "content_type", "no_choices")

# Context-length errors as providers send them (status, body).
CONTEXT_ERRORS: dict[str, tuple[int, dict[str, Any]]] = {
    "openai": (400, {"error": {
        "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in "
                   "9120 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
    "anthropic": (400, {"type": "error", "error": {
        "type": "invalid_request_error", "message": "prompt is too long: 215837 tokens > 200000 maximum"}}),
    "vllm": (400, {"object": "error", "type": "BadRequestError", "param": None, "code": 400,
                   "message": "This model's maximum context length is 4096 tokens. However, you requested 5310 "
                              "tokens (1214 in the messages, 4096 in the completion). Please reduce the length "
                              "of the messages or completion."}),
    "llamacpp": (400, {"error": {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 9001,
                                 "n_ctx": 8192,
                                 "message": "the request exceeds the available context size, try increasing it"}}),
    "tgi": (422, {"error_type": "validation",
                  "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. "
                           "Given: 5000 `inputs` tokens and 100 `max_new_tokens`"}),
}


@dataclass
class StubConfig:
    latency_ms: float = 0.0
    jitter_ms: float = 0.0  # uniform extra latency in [0, jitter_ms], seeded per request
    seed: int = 0
    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_503: float = 0.0
    rate_slow: float = 0.0  # answered after ``slow_s`` seconds (set it above the client's timeout)
    rate_malformed: float = 0.0  # a 200 whose body is broken (kind chosen by hash from MALFORMED_KINDS)
    retry_after: float = 1.0  # seconds, sent with every 429
    slow_s: float = 5.0
    giveup_rate: float = 0.0  # prompts that fail with 500 on every attempt (a share chosen by hash)
    giveup_match: str = ""  # ... and prompts whose first user message contains this text
    fault_steps: tuple[str, ...] = ()  # faults only for these steps (empty: all)
    fail_first: int = 0  # the first N attempts of every prompt get ``fail_first_kind`` (deterministic retries)
    fail_first_kind: str = "429"
    garbage_steps: tuple[str, ...] = ()  # these steps get a well-formed reply with unusable text ...
    garbage_rate: float = 1.0  # ... for this share of their prompts (re-asks of a prompt included)
    echo_key_steps: tuple[str, ...] = ()  # these steps get a 401 that echoes the caller's full API key ...
    echo_key_rate: float = 1.0  # ... for this share of their prompts
    echo_key_status: int = 401  # 401: a rejected key (fatal: the job stops); 400: a request error quoting it
    context_error: str | None = None  # one of CONTEXT_ERRORS
    context_error_steps: tuple[str, ...] = ()  # empty: every step
    judge_score: str = "7.5"
    length_steps: tuple[str, ...] = ()  # these steps get their reply cut in half, finish_reason "length"
    content_filter_steps: tuple[str, ...] = ()  # these steps get no content, finish_reason "content_filter"
    refusal_steps: tuple[str, ...] = ()  # ... or no content and a ``refusal`` (OpenAI structured outputs)
    record_bodies: bool = False  # keep every request body (``StubServer.bodies``): what went over the wire
    record_headers: tuple[str, ...] = ()  # count the values these request headers arrived with (``header_values``)
    model_ids: tuple[str, ...] = ("stub",)  # what GET /v1/models lists (clients that check a model exists)
    rpm: float = 0.0  # a key's limits as OpenAI enforces them (rate_limits.py); 0: none
    tpm: float = 0.0
    closed_s: float = 0.0  # every request 429 for this long from the first one (inf: for ever)
    refuse: str = ""  # "401" | "403" | "404" | "insufficient_quota" | "daily": every request refused (rate_limits.py)
    omit_usage: bool = False  # replies (live and batch rows) carry no ``usage``: billed by the stub's own count
    rate_empty_choices: float = 0.0  # a 200 with ``choices: []`` (usage: the prompt, billed)
    rate_content_null: float = 0.0  # a 200 whose message has ``content: null``, no refusal, no tool call


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _unit(*parts: Any) -> float:
    """A deterministic number in [0, 1) from the parts."""
    return int(digest("\x1f".join(map(str, parts)))[:13], 16) / 16 ** 13


# ---------------------------------------------------------------- recognising the step


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def prompt_of(messages: list[dict[str, Any]]) -> tuple[str, str]:
    """(system text, first user text): what the step's template produced, re-asks excluded."""
    system = "".join(_content(m) for m in messages if m.get("role") in ("system", "developer"))
    user = next((_content(m) for m in messages if m.get("role") == "user"), "")
    return system, user


def request_schema(body: dict[str, Any]) -> dict[str, Any]:
    return ((body.get("response_format") or {}).get("json_schema") or {}).get("schema") or {}


# A key no evaluation schema has -> the synthesis step whose schema has it.
_SYNTHESIS_KEYS = (("personas", "persona"), ("factor", "factors"), ("reason", "changed_preference"),
                   ("story", "session"), ("selected_items", "user_simulator"))


def synthesis_step(schema: dict[str, Any]) -> str | None:
    props = schema.get("properties") or {}
    for key, step in _SYNTHESIS_KEYS:
        if key in props:
            return step
    results = ((props.get("results") or {}).get("items") or {}).get("properties") or {}
    return "validate" if "expressed" in results else None


def classify(body: dict[str, Any]) -> str:
    schema = request_schema(body)
    props = set((schema.get("properties") or {}).keys())
    synthesis = synthesis_step(schema)
    if synthesis:
        return synthesis
    if props:
        for key, step in (("summaries", "summarize"), ("results", "match"), ("checklist", "decompose"),
                          ("score", "judge"), ("preference", "infer")):
            if key in props:
                return step
    system, user = prompt_of(body.get("messages") or [])
    text = system + "\n" + user
    if "Summarise every session" in user or '"summaries"' in text:
        return "summarize"
    if "Evaluation Score" in system or "critical evaluator" in system:
        return "judge"
    if "#### Checklist" in user:
        return "match"
    if "**Preferences**" in user or "evaluation checklist" in system:
        return "decompose"
    if "Most Likely Preference" in text:
        return "infer"
    if "User's Request" in user or "Respond to the user's request" in system:
        return "generate"
    if "helpful conversational assistant" in system:
        return "assistant_simulator"
    return "unknown"


# ---------------------------------------------------------------- well-formed replies

_WANTS = ("concise", "step-by-step", "formal", "friendly", "detailed", "bullet-pointed", "sourced", "practical")
_THINGS = ("worked examples", "a summary table", "one closing question", "plain language", "cited sources",
           "a short checklist", "concrete numbers", "a clear recommendation")


def _words(h: str, offset: int, options: tuple[str, ...]) -> str:
    return options[int(h[offset:offset + 2], 16) % len(options)]


def numbered_lines(text: str, after: str) -> list[str]:
    """The '1. …' lines following the header ``after`` (the matcher's checklist)."""
    tail = text.split(after, 1)[-1]
    return [m.group(1).strip() for m in re.finditer(r"^\s*\d+\.\s+(.*)$", tail, re.MULTILINE)]


_VOCAB = ("amber", "anchor", "atlas", "basil", "beacon", "birch", "bramble", "cedar", "cinder", "clover", "cobalt",
          "comet", "coral", "cricket", "delta", "ember", "falcon", "fennel", "fjord", "garnet", "glacier", "granite",
          "harbor", "hazel", "heron", "indigo", "island", "jasper", "juniper", "kestrel", "lagoon", "lantern",
          "lilac", "maple", "marble", "meadow", "meteor", "nectar", "nutmeg", "oasis", "onyx", "orchid", "otter",
          "pebble", "pepper", "pine", "quartz", "quill", "raven", "reef", "saffron", "sable", "sierra", "spruce",
          "summit", "thistle", "timber", "topaz", "tundra", "velvet", "willow", "walnut", "yarrow", "zephyr")


def stub_sentence(key: str, min_len: int = 0, max_len: int = 200) -> str:
    """Words drawn by ``key`` plus a token unique to it: no two fields share much, none is a placeholder."""
    target = max(min_len, min(max_len, 24))
    words = [f"k{key[:6]}"]
    i = 0
    while len(" ".join(words)) + 1 < target:
        words.append(_VOCAB[int(digest(f"{key}\x1f{i}")[:4], 16) % len(_VOCAB)])
        i += 1
    text = " ".join(words[1:] + words[:1]).capitalize()
    return (text[: max(1, max_len - 1)].rstrip() + ".")[:max_len]


def schema_value(schema: dict[str, Any], key: str, position: int | None = None) -> Any:
    """A value valid under ``schema`` (the subset synthesis uses), drawn deterministically by ``key``.

    An enum inside an array takes its item's position (checklist indices 1, 2, ...), elsewhere a
    draw; an array gets its minItems, or one item.
    """
    draw = int(digest(key)[:8], 16)
    if "enum" in schema:
        options = schema["enum"]
        return options[position % len(options)] if position is not None else options[draw % len(options)]
    kind = schema.get("type")
    if kind == "object":
        return {name: schema_value(sub, f"{key}/{name}", position)
                for name, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        n = schema.get("minItems", min(1, schema.get("maxItems", 1)))
        return [schema_value(schema.get("items") or {}, f"{key}[{i}]", i) for i in range(n)]
    if kind == "boolean":
        return bool(draw % 2)
    if kind in ("integer", "number"):
        low, high = int(schema.get("minimum", 1)), int(schema.get("maximum", 10))
        return low + draw % (high - low + 1)
    return stub_sentence(digest(key), int(schema.get("minLength", 0)), int(schema.get("maxLength", 200)))


def synthesis_reply(step: str, body: dict[str, Any], cfg: StubConfig) -> str:
    """JSON from the request's schema, keyed by the whole conversation (a re-ask or a later turn differs)."""
    key = digest(f"{cfg.seed}\x1f{json.dumps(body.get('messages'), sort_keys=True)}")
    if step == "assistant_simulator":
        return f"Here is my answer. {stub_sentence(key, 60, 300)}"
    return json.dumps(schema_value(request_schema(body), key))


def reply_text(step: str, body: dict[str, Any], cfg: StubConfig) -> str:
    if step in SYNTHESIS_STEPS:
        return synthesis_reply(step, body, cfg)
    system, user = prompt_of(body.get("messages") or [])
    h = digest(f"{cfg.seed}\x1f{system}\x1f{user}")
    structured = bool(body.get("response_format"))
    if step == "infer":
        sentence = (f"The user wants {_words(h, 0, _WANTS)} answers with {_words(h, 2, _THINGS)} "
                    f"and {_words(h, 4, _THINGS)} for requests like this (ref {h[:8]}).")
        if structured:
            return json.dumps({"preference": sentence})
        return (f"### Analysis\n\nSessions {int(h[6], 16) % 8 + 1} and {int(h[7], 16) % 8 + 1} match the "
                f"current request.\n\n### Most Likely Preference\n\n{sentence}")
    if step == "decompose":
        n = int(h[0], 16) % 4 + 1
        items = [f"Does the response use {_words(h, 2 + 2 * i, _THINGS)} (item {i + 1}, {h[10:16]})?"
                 for i in range(n)]
        payload = {"analysis": f"The preference states {n} requirement(s).", "checklist": items}
        return json.dumps(payload) if structured else (
            f"**Analysis**\n\n{payload['analysis']}\n\n**Checklist**\n\n```json\n"
            f"{json.dumps({'checklist': items}, indent=2)}\n```")
    if step == "match":
        items = numbered_lines(user, "#### Checklist")
        results = [{"index": i, "entry": item, "reasoning": "Compared with the preference.",
                    "label": LABELS[int(digest(f'{h}{i}')[:2], 16) % 3]}
                   for i, item in enumerate(items, start=1)]
        payload = {"results": results}
        return json.dumps(payload) if structured else f"```json\n{json.dumps(payload, indent=2)}\n```"
    if step == "summarize":
        n = len(re.findall(r"^### Session \d+", user, re.MULTILINE))
        summaries = [{"session_id": i, "analysis": f"Session {i} ({h[:6]}).",
                      "context": [f"context of session {i}"],
                      "preferences": [f"wants {_words(h, 2 * (i % 8), _THINGS)}"]} for i in range(1, n + 1)]
        payload = {"summaries": summaries}
        return json.dumps(payload) if structured else f"```json\n{json.dumps(payload, indent=2)}\n```"
    if step == "judge":
        if structured:
            return json.dumps({"evaluation": "Checked every item.", "score": float(cfg.judge_score)})
        return f"### Evaluation of AI Assistant's Response\n\nChecked every item.\n\n### Evaluation Score\n\n" \
               f"{cfg.judge_score}"
    if step == "generate":
        return (f"Here is a {_words(h, 0, _WANTS)} answer with {_words(h, 2, _THINGS)}.\n\n"
                f"1. First point ({h[:6]}).\n2. Second point.\n")
    return f"Stub reply {h[:12]}."


def garbage_text(body: dict[str, Any], cfg: StubConfig) -> str:
    """Unusable text; it differs between a prompt and its re-asks, as a real model's would."""
    conversation = json.dumps(body.get("messages"), sort_keys=True)
    return f"I'd rather talk about the weather today. <<unusable reply {digest(conversation)[:10]}>>"


def billed_tokens(body: dict[str, Any], reply: dict[str, Any]) -> tuple[int, int]:
    """(prompt, completion) tokens a reply is billed: its usage, or, where it carries none, litellm's token count
    of the request's messages and the reply's text (tiktoken for OpenAI's models)."""
    usage = reply.get("usage")
    if usage:
        return int(usage["prompt_tokens"]), int(usage["completion_tokens"])
    import litellm

    model = str(body.get("model") or "stub")
    text = "".join(str((c.get("message") or {}).get("content") or "") for c in reply.get("choices") or [])
    prompt = litellm.token_counter(model=model, messages=body.get("messages") or [])
    return prompt, litellm.token_counter(model=model, text=text, count_response_tokens=True) if text else 0


def completion_body(text: str | None, body: dict[str, Any], finish_reason: str = "stop",
                    refusal: str | None = None) -> dict[str, Any]:
    prompt_chars = sum(len(_content(m)) for m in body.get("messages") or [])
    prompt_tokens, completion_tokens = max(1, prompt_chars // 4), max(1, len(text or refusal or "") // 4)
    message = {"role": "assistant", "content": text, **({"refusal": refusal} if refusal else {})}
    return {"id": "chatcmpl-stub-" + digest(text or "")[:12], "object": "chat.completion", "created": 0,
            "model": body.get("model", "stub"),
            "choices": [{"index": 0, "finish_reason": finish_reason, "message": message}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


# ---------------------------------------------------------------- the server


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # the default backlog of 5 drops connections under 32+ concurrent clients

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (killed, interrupted) is what real servers shrug off; anything else is printed."""
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


@dataclass
class _Counters:
    received: Counter = field(default_factory=Counter)
    completed: Counter = field(default_factory=Counter)
    faults: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    in_flight: int = 0
    peak_in_flight: int = 0  # the most requests it was answering at once
    held: int = 0
    completed_prompts: Counter = field(default_factory=Counter)  # digest of the request -> completions
    tokens: Counter = field(default_factory=Counter)  # prompt/completion tokens of the completed responses
    billed: Counter = field(default_factory=Counter)  # requests, prompt_tokens, completion_tokens: what was billed


class StubServer:
    """The stand-in model. Use as a context manager (a background thread) or via ``serve_forever``."""

    def __init__(self, config: StubConfig | None = None, *, port: int = 0, batch: BatchQueueConfig | None = None,
                 **overrides: Any):
        self.config = config or StubConfig()
        for k, v in overrides.items():
            setattr(self.config, k, v)
        self._lock = threading.Lock()
        self._gate = threading.Condition(self._lock)
        self._hold_after: int | None = None
        self._releases = 0
        self._seen: Counter = Counter()
        self.counters = _Counters()
        self.bodies: list[dict[str, Any]] = []  # request bodies, when ``record_bodies`` is on
        self.header_values: dict[str, Counter] = defaultdict(Counter)  # header -> values, for ``record_headers``
        self.batches = BatchQueue(self._batch_row, batch)  # OpenAI's Files and Batch endpoints
        self.limits = KeyLimits(self.config.rpm, self.config.tpm, self.config.closed_s, self.config.refuse)
        self.httpd = _HTTPServer(("127.0.0.1", port), self._handler())
        self._thread: threading.Thread | None = None

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
            self.limits = KeyLimits(self.config.rpm, self.config.tpm, self.config.closed_s, self.config.refuse)

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
        deadline = time.monotonic() + timeout
        with self._gate:
            while self.counters.held and deadline - time.monotonic() > 0:
                self._gate.wait(deadline - time.monotonic())

    def wait_held(self, timeout: float) -> bool:
        """True once the gate is closed and at least one request waits at it."""
        deadline = time.monotonic() + timeout
        with self._gate:
            while self.counters.held == 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._gate.wait(left)
            return True

    def stats(self) -> dict[str, Any]:
        with self._lock:
            c = self.counters
            return {"received": dict(c.received), "completed": dict(c.completed),
                    "faults": {k: dict(v) for k, v in c.faults.items()},
                    "total_received": sum(c.received.values()), "total_completed": sum(c.completed.values()),
                    "in_flight": c.in_flight, "peak_in_flight": c.peak_in_flight, "held": c.held,
                    "repeated_completions": sum(n - 1 for n in c.completed_prompts.values() if n > 1),
                    "distinct_completed": len(c.completed_prompts), "tokens": dict(c.tokens),
                    "billed": {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, **c.billed},
                    "rate_limited": sum(f.get("429", 0) for f in c.faults.values()),
                    "limits_ideal_s": self.limits.ideal_s}

    def __enter__(self) -> "StubServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _batch_row(self, body: dict[str, Any]) -> dict[str, Any]:
        """A batch row's reply: what a live call with the same body gets (without live faults)."""
        step = classify(body)
        with self._lock:
            self.counters.completed[step] += 1
        return self._billed(body, completion_body(reply_text(step, body, self.config), body))

    def _billed(self, body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        """``reply`` as sent (without usage under ``omit_usage``), its tokens counted as billed."""
        if self.config.omit_usage:
            reply = {k: v for k, v in reply.items() if k != "usage"}
        prompt, completion = billed_tokens(body, reply)
        with self._lock:
            self.counters.billed.update(requests=1, prompt_tokens=prompt, completion_tokens=completion)
        return reply

    # ---- decisions

    def _fault(self, step: str, prompt_digest: str, attempt: int, body: dict[str, Any]) -> str | None:
        cfg = self.config
        if cfg.context_error and (not cfg.context_error_steps or step in cfg.context_error_steps):
            return "context_length"
        if step in cfg.echo_key_steps and _unit(cfg.seed, "echo", prompt_digest) < cfg.echo_key_rate:
            return "echo_key"
        if cfg.fault_steps and step not in cfg.fault_steps:
            return None
        if attempt < cfg.fail_first:
            return cfg.fail_first_kind
        if cfg.giveup_rate and _unit(cfg.seed, "giveup", prompt_digest) < cfg.giveup_rate:
            return "500"
        if cfg.giveup_match and cfg.giveup_match in prompt_of(body.get("messages") or [])[1]:
            return "500"
        u = _unit(cfg.seed, "fault", prompt_digest, attempt)
        for kind, rate in (("429", cfg.rate_429), ("500", cfg.rate_500), ("503", cfg.rate_503),
                           ("slow", cfg.rate_slow), ("malformed", cfg.rate_malformed),
                           ("empty_choices", cfg.rate_empty_choices), ("content_null", cfg.rate_content_null)):
            if u < rate:
                return kind
            u -= rate
        return None

    def _garbage(self, step: str, body: dict[str, Any]) -> bool:
        if step not in self.config.garbage_steps:
            return False
        system, user = prompt_of(body.get("messages") or [])  # the template's prompt: re-asks share it
        return _unit(self.config.seed, "garbage", system, user) < self.config.garbage_rate

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else headers and body in two writes stall ~40 ms on delayed ACKs

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: bytes, content_type: str = "application/json",
                      headers: dict[str, str] | None = None) -> bool:
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
                status, payload, *headers = routed
                if isinstance(payload, bytes):
                    self._send(status, payload, "application/octet-stream")
                else:
                    self._send(status, json.dumps(payload).encode(), headers=headers[0] if headers else None)
                return True

            def do_GET(self) -> None:  # noqa: N802
                if self._batch_api("GET", b""):
                    return
                if self.path.rstrip("/") in ("/v1/models", "/models"):
                    # and the connection closed: a client that lists models and then forks workers (the official
                    # runner does) would leave one keep-alive socket shared by all of them, and the responses
                    # read by the wrong process (requests that hang until the client's 600 s timeout)
                    self.close_connection = True
                    self._send(200, json.dumps({"object": "list", "data": [
                        {"id": m, "object": "model", "owned_by": "stub"} for m in server.config.model_ids]}).encode(),
                        headers={"connection": "close"})
                elif self.path.rstrip("/") in ("/stats", "/health"):
                    self._send(200, json.dumps(server.stats()).encode())
                else:
                    self._send(404, b'{"error": {"message": "not found"}}')

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                if self.path.rstrip("/") == "/reset":
                    server.reset()
                    self._send(200, b"{}")
                    return
                if self._batch_api("POST", raw):
                    return
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    self._send(400, b'{"error": {"message": "invalid JSON body"}}')
                    return
                with server._lock:
                    for name in server.config.record_headers:
                        if (value := self.headers.get(name)) is not None:
                            server.header_values[name.lower()][value] += 1
                server._serve(self, body, raw, self.headers.get("authorization", ""))

        return Handler

    def _serve(self, handler: BaseHTTPRequestHandler, body: dict[str, Any], raw: bytes, auth: str = "") -> None:
        cfg = self.config
        step = classify(body)
        prompt_digest = digest(json.dumps(body.get("messages"), sort_keys=True))
        request_digest = digest(raw.decode("utf-8", "replace"))
        with self._gate:
            if cfg.record_bodies:
                self.bodies.append(body)
            self.counters.received[step] += 1
            self.counters.in_flight += 1
            self.counters.peak_in_flight = max(self.counters.peak_in_flight, self.counters.in_flight)
            attempt = self._seen[prompt_digest]
            self._seen[prompt_digest] += 1
        try:
            if self.limits.active and (verdict := self.limits.check(body)) is not None:  # answered at once
                with self._lock:
                    self.counters.faults[step][verdict.kind] += 1
                handler._send(verdict.status, json.dumps(verdict.body).encode(), headers=verdict.headers)
                return
            delay = cfg.latency_ms / 1000
            if cfg.jitter_ms:
                delay += random.Random(f"{cfg.seed}:{prompt_digest}:{attempt}").uniform(0, cfg.jitter_ms) / 1000
            if delay > 0:
                time.sleep(delay)
            fault = self._fault(step, prompt_digest, attempt, body)
            if fault is None or fault == "malformed":
                # a reply about to complete waits at a closed gate
                with self._gate:
                    if self._hold_after is not None and sum(self.counters.completed.values()) >= self._hold_after:
                        self.counters.held += 1
                        self._gate.notify_all()
                        released = self._releases
                        while self._releases == released:
                            self._gate.wait()
                        self.counters.held -= 1
                        self._gate.notify_all()
                        handler.close_connection = True
                        return  # released: the client is gone; answer nothing
            if fault is not None:
                with self._lock:
                    self.counters.faults[step][fault] += 1
                self._send_fault(handler, fault, body, auth)
                return
            text = garbage_text(body, cfg) if self._garbage(step, body) else reply_text(step, body, cfg)
            finish = "stop"
            if step in cfg.length_steps:  # a reply that ran into max_tokens
                text, finish = text[: len(text) // 2], "length"
            refusal = None
            if step in cfg.content_filter_steps:
                text, finish = None, "content_filter"
            elif step in cfg.refusal_steps:
                text, refusal = None, "I'm sorry, I can't help with that request."
            full = completion_body(text, body, finish, refusal)
            reply = self._billed(body, full)  # processed: billed even if the client has gone
            if handler._send(200, json.dumps(reply).encode()):  # type: ignore[attr-defined]
                with self._lock:
                    self.counters.completed[step] += 1
                    self.counters.completed_prompts[request_digest] += 1
                    self.counters.tokens.update({k: full["usage"][k] for k in ("prompt_tokens", "completion_tokens")})
        finally:
            with self._lock:
                self.counters.in_flight -= 1

    def _send_fault(self, handler: Any, fault: str, body: dict[str, Any], auth: str = "") -> None:
        cfg = self.config
        if fault == "echo_key":  # some providers quote the key they rejected (or, in a 400, the request's fields)
            key = auth.removeprefix("Bearer ").strip()
            rejected = cfg.echo_key_status == 401
            handler._send(cfg.echo_key_status, json.dumps({"error": {
                "message": f"Incorrect API key provided: {key}." if rejected else f"Invalid request from key {key}.",
                "type": "invalid_request_error", "code": "invalid_api_key" if rejected else None}}).encode())
        elif fault == "429":
            handler._send(429, json.dumps({"error": {"message": "Rate limit reached; slow down.",
                                                     "type": "rate_limit_error", "code": "rate_limit_exceeded"}}
                                          ).encode(), headers={"retry-after": f"{cfg.retry_after:g}"})
        elif fault == "500":
            handler._send(500, b'{"error": {"message": "The server had an error processing your request.", '
                               b'"type": "server_error"}}')
        elif fault == "503":
            handler._send(503, b'{"error": {"message": "The engine is currently overloaded.", '
                               b'"type": "service_unavailable"}}')
        elif fault == "slow":  # processed (and billed) after the client's timeout
            time.sleep(cfg.slow_s)
            handler._send(200, json.dumps(self._billed(body, completion_body("too late", body))).encode())
        elif fault == "empty_choices":  # a 200 without a completion: the prompt is billed all the same
            empty = completion_body("", body)
            empty["choices"], empty["usage"]["completion_tokens"] = [], 0
            empty["usage"]["total_tokens"] = empty["usage"]["prompt_tokens"]
            handler._send(200, json.dumps(self._billed(body, empty)).encode())
        elif fault == "content_null":
            handler._send(200, json.dumps(self._billed(body, completion_body(None, body))).encode())
        elif fault == "context_length":
            status, payload = CONTEXT_ERRORS[cfg.context_error or "openai"]
            handler._send(status, json.dumps(payload).encode())
        elif fault == "malformed":
            text = reply_text(classify(body), body, cfg)
            full = json.dumps(completion_body(text, body)).encode()
            kind = MALFORMED_KINDS[int(digest(full.decode())[:2], 16) % len(MALFORMED_KINDS)]
            if kind == "truncated":
                handler._send(200, full[: len(full) // 2])
            elif kind == "content_type":
                handler._send(200, b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html")
            else:
                handler._send(200, json.dumps({"id": "chatcmpl-stub", "object": "chat.completion",
                                               "created": 0, "model": "stub"}).encode())


def parse_args(argv: list[str] | None = None) -> tuple[int, StubConfig]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    for f in StubConfig.__dataclass_fields__.values():
        flag = "--" + f.name.replace("_", "-")
        if f.name.endswith("_steps"):
            p.add_argument(flag, default="", help="comma-separated steps: " + ",".join(STEPS + SYNTHESIS_STEPS))
        elif f.name == "model_ids":
            p.add_argument(flag, default="stub", help="comma-separated model ids for GET /v1/models")
        elif f.name == "record_headers":
            p.add_argument(flag, default="", help="comma-separated request headers whose values are counted")
        elif isinstance(f.default, bool):
            p.add_argument(flag, action="store_true")
        elif f.name in ("context_error", "judge_score", "fail_first_kind", "giveup_match", "refuse"):
            p.add_argument(flag, default=f.default)
        else:
            p.add_argument(flag, type=type(f.default), default=f.default)
    args = vars(p.parse_args(argv))
    port = args.pop("port")
    for name in list(args):
        if name.endswith("_steps") or name in ("model_ids", "record_headers"):
            args[name] = tuple(s for s in args[name].split(",") if s)
    return port, StubConfig(**args)


def main(argv: list[str] | None = None) -> None:
    port, cfg = parse_args(argv)
    server = StubServer(cfg, port=port)
    print(f"stub LLM server listening on {server.url} ({json.dumps(asdict(cfg))})", flush=True)
    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.httpd.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        pass
    finally:
        print("stub stats " + json.dumps(server.stats()), file=sys.stderr, flush=True)
        server.httpd.server_close()


if __name__ == "__main__":
    main()
