"""Every knob of the stub's replies and faults, and the steps it recognises."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any

STEPS = ("infer", "decompose", "match", "generate", "judge", "summarize", "unknown")
# Synthesis's own steps (its decomposition is evaluation's "decompose").
SYNTHESIS_STEPS = ("persona", "factors", "changed_preference", "session", "user_simulator", "validate",
                   "assistant_simulator")


@dataclass
class Faults:
    """A request's failures: the shares of prompts answered with an error, and which prompts, steps and attempts."""

    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_503: float = 0.0
    rate_slow: float = 0.0  # answered after ``slow_s`` seconds (set it above the client's timeout)
    rate_malformed: float = 0.0  # a 200 whose body is broken (kind chosen by hash from MALFORMED_KINDS)
    rate_empty_choices: float = 0.0  # a 200 with ``choices: []`` (usage: the prompt, billed)
    rate_content_null: float = 0.0  # a 200 whose message has ``content: null``, no refusal, no tool call
    retry_after: float = 1.0  # seconds, sent with every 429
    rate_limit_style: str = ""  # how a 429 says the wait (rate_limits.RATE_LIMIT_STYLES), "rotate": each in turn
    slow_s: float = 5.0
    giveup_rate: float = 0.0  # prompts that fail with 500 on every attempt (a share chosen by hash)
    giveup_match: str = ""  # ... and prompts whose first user message contains this text
    fault_steps: tuple[str, ...] = ()  # faults only for these steps (empty: all)
    fail_first: int = 0  # the first N attempts of every prompt get ``fail_first_kind`` (deterministic retries)
    fail_first_kind: str = "429"  # or kinds in turn, comma-separated: "500,503", "truncated,content_type,no_choices"


@dataclass
class Replies:
    """Replies that arrive but cannot be used as they are: unusable, cut, filtered, refused, too long."""

    garbage_steps: tuple[str, ...] = ()  # these steps get a well-formed reply with unusable text ...
    garbage_rate: float = 1.0  # ... for this share of their prompts (re-asks of a prompt included)
    echo_key_steps: tuple[str, ...] = ()  # these steps get a 401 that echoes the caller's full API key ...
    echo_key_rate: float = 1.0  # ... for this share of their prompts
    echo_key_status: int = 401  # 401: a rejected key (fatal: the job stops); 400: a request error quoting it
    context_error: str | None = None  # one of CONTEXT_ERRORS
    context_error_steps: tuple[str, ...] = ()  # empty: every step
    judge_score: str = "7.5"
    length_steps: tuple[str, ...] = ()  # these steps get their reply cut in half, finish_reason "length" ...
    length_rate: float = 1.0  # ... for this share of their prompts (by hash, their re-asks too) ...
    length_whole: bool = False  # ... its text kept whole (a reply that still parses: only finish_reason says so)
    content_filter_steps: tuple[str, ...] = ()  # these steps get no content, finish_reason "content_filter"
    refusal_steps: tuple[str, ...] = ()  # ... or no content and a ``refusal`` (OpenAI structured outputs)
    long_steps: tuple[str, ...] = ()  # these steps' (free-text) replies grow by ``long_bytes`` of filler ...
    long_bytes: int = 0  # ... between a line ``LONG-REPLY <hash>`` and a last ``LONG-REPLY-END <hash>`` (whole copies)


@dataclass
class Limits:
    """The key's limits and refusals as a provider enforces them (``rate_limits.py``), and an outage."""

    rpm: float = 0.0  # a key's limits as OpenAI enforces them (rate_limits.py); 0: none
    tpm: float = 0.0
    limits_pool: str = "model"  # "key": one pool of rpm/tpm for every model (rate_limits.py), not one per model
    limit_headers: str = "openai"  # "retry-after": a 429 states only retry-after, in whole seconds
    bucket: str = "windows"  # "continuous": rpm/tpm as a bucket of one second's share refilled continuously
    closed_s: float = 0.0  # every request 429 for this long from the first one (inf: for ever)
    refuse: str = ""  # "401" | "403" | "404" | "insufficient_quota" | "daily": every request refused (rate_limits.py)
    outage_after: int = 0  # an outage begins at the request after this many (any route, the Batch API's too) ...
    outage_s: float = 0.0  # ... and lasts this long (inf: until switched off); 0: no outage
    outage_kind: str = "reset"  # "reset": connections closed unanswered (a server gone); "502"|"503"|"504": a proxy's


@dataclass
class Wire:
    """What the server does besides answering: its latency, what it records and lists, the usage it reports."""

    latency_ms: float = 0.0
    jitter_ms: float = 0.0  # uniform extra latency in [0, jitter_ms], seeded per request
    record_bodies: bool = False  # keep every request body (``StubServer.bodies``): what went over the wire
    record_headers: tuple[str, ...] = ()  # count the values these request headers arrived with (``header_values``)
    model_ids: tuple[str, ...] = ("stub",)  # what GET /v1/models lists (clients that check a model exists)
    omit_usage: bool = False  # replies (live and batch rows) carry no ``usage``: billed by the stub's own count
    close_connections: bool = False  # answer as HTTP/1.0: each connection closed after its reply (no keep-alive)


#: each knob's group (a knob's flat name is what StubServer(**knobs), ``reconfigure`` and the command line take)
KNOBS = {f.name: group for group, kind in (("faults", Faults), ("replies", Replies), ("limits", Limits),
                                          ("wire", Wire)) for f in fields(kind)}


class StubConfig:
    """Every knob, in its group, set by its flat name: ``StubConfig(rate_429=0.5, seed=1)``."""

    __slots__ = ("seed", "faults", "replies", "limits", "wire")  # a knob set by its flat name here fails loudly

    def __init__(self, **knobs: object):
        self.seed = 0  # of every share chosen by hash, and of the jitter
        self.faults, self.replies, self.limits, self.wire = Faults(), Replies(), Limits(), Wire()
        self.set(**knobs)

    def set(self, **knobs: object) -> None:
        for name, value in knobs.items():
            if name != "seed" and name not in KNOBS:
                raise TypeError(f"the stub has no knob {name!r}")
            setattr(getattr(self, KNOBS[name]) if name in KNOBS else self, name, value)

    def knobs(self) -> dict[str, Any]:
        """Every knob by its flat name."""
        return {"seed": self.seed, **{name: getattr(getattr(self, group), name) for name, group in KNOBS.items()}}


def stub_arguments(argv: list[str] | None, description: str) -> tuple[int, StubConfig]:
    """The stub's command line: ``--port`` and one flag per knob."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    for name, default in StubConfig().knobs().items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, tuple):  # model_ids, record_headers, the *_steps
            p.add_argument(flag, default=",".join(default), type=lambda v: tuple(s for s in v.split(",") if s),
                           help="comma-separated" + (": " + ",".join(STEPS + SYNTHESIS_STEPS)
                                                     if name.endswith("_steps") else ""))
        elif isinstance(default, bool):
            p.add_argument(flag, action="store_true")
        else:
            p.add_argument(flag, default=default, type=type(default) if isinstance(default, (int, float)) else None)
    args = vars(p.parse_args(argv))
    return args.pop("port"), StubConfig(**args)
