"""The stub's faults, as providers send them, chosen by hashes so arrival order does not matter."""

from __future__ import annotations

import json
from typing import Any

from cupid_exp.testing.rate_limits import rate_limit_reply
from cupid_exp.testing.stub_config import StubConfig
from cupid_exp.testing.stub_replies import completion_body, digest, prompt_of, reply_text, unit

MALFORMED_KINDS = ("truncated", "content_type", "no_choices")  # "malformed" picks one by hash; each can be named

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


def choose_fault(cfg: StubConfig, step: str, prompt_digest: str, attempt: int, body: dict[str, Any]) -> str | None:
    """The fault this attempt of this prompt gets, if any, by hashes."""
    r, f = cfg.replies, cfg.faults
    if r.context_error and (not r.context_error_steps or step in r.context_error_steps):
        return "context_length"
    if step in r.echo_key_steps and unit(cfg.seed, "echo", prompt_digest) < r.echo_key_rate:
        return "echo_key"
    if f.fault_steps and step not in f.fault_steps:
        return None
    if attempt < f.fail_first:
        kinds = f.fail_first_kind.split(",")
        return kinds[min(attempt, len(kinds) - 1)]
    if ((f.giveup_rate and unit(cfg.seed, "giveup", prompt_digest) < f.giveup_rate)
            or (f.giveup_match and f.giveup_match in prompt_of(body.get("messages") or [])[1])):
        return "500"  # a prompt that always fails
    u = unit(cfg.seed, "fault", prompt_digest, attempt)
    for kind, rate in (("429", f.rate_429), ("500", f.rate_500), ("503", f.rate_503), ("slow", f.rate_slow),
                       ("malformed", f.rate_malformed), ("empty_choices", f.rate_empty_choices),
                       ("content_null", f.rate_content_null)):
        if u < rate:
            return kind
        u -= rate
    return None


def cut_reply(cfg: StubConfig, step: str, body: dict[str, Any], text: str) -> str | None:
    """A reply cut at max_tokens for ``length_steps`` (whole with ``length_whole``); None if complete."""
    if (step not in cfg.replies.length_steps
            or unit(cfg.seed, "length", *prompt_of(body.get("messages") or [])) >= cfg.replies.length_rate):
        return None
    return text if cfg.replies.length_whole else text[: len(text) // 2]


def answer(cfg: StubConfig, step: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The completion when no fault is chosen, and whether it was cut; the HTTP and in-process stubs share it."""
    system, user = prompt_of(body.get("messages") or [])  # the template's prompt: its re-asks share it
    if step in cfg.replies.garbage_steps and unit(cfg.seed, "garbage", system, user) < cfg.replies.garbage_rate:
        # unusable text; it differs between a prompt and its re-asks, as a real model's would
        conversation = json.dumps(body.get("messages"), sort_keys=True)
        text: str | None = f"I'd rather talk about the weather today. <<unusable reply {digest(conversation)[:10]}>>"
    else:
        text = reply_text(step, body, cfg)
    finish, refusal = "stop", None
    if (cut := cut_reply(cfg, step, body, text or "")) is not None:
        text, finish = cut, "length"
    if step in cfg.replies.content_filter_steps:
        text, finish = None, "content_filter"
    elif step in cfg.replies.refusal_steps:
        text, refusal = None, "I'm sorry, I can't help with that request."
    return completion_body(text, body, finish, refusal), cut is not None


def no_completion(fault: str, body: dict[str, Any]) -> dict[str, Any]:
    """A 200 without a completion (``choices: []`` or ``content: null``): the prompt is billed all the same."""
    reply = completion_body("" if fault == "empty_choices" else None, body)
    if fault == "empty_choices":
        reply["choices"], reply["usage"]["completion_tokens"] = [], 0
        reply["usage"]["total_tokens"] = reply["usage"]["prompt_tokens"]
    return reply


def error_reply(kind: str, cfg: StubConfig, style: str = "") -> tuple[int, dict[str, Any], dict[str, str], float]:
    """(status, body, headers, wait) of a 429 in ``style``, a 500 or a 503, as OpenAI sends them."""
    if kind == "429" and not style:
        body = {"error": {"message": "Rate limit reached; slow down.", "type": "rate_limit_error",
                          "code": "rate_limit_exceeded"}}
        return 429, body, {"retry-after": f"{cfg.faults.retry_after:g}"}, cfg.faults.retry_after
    if kind == "429":
        return (429, *rate_limit_reply(style, cfg.faults.retry_after))
    if kind == "500":
        return 500, {"error": {"message": "The server had an error processing your request.",
                               "type": "server_error"}}, {}, 0.0
    if kind == "503":
        overloaded = {"error": {"message": "The engine is currently overloaded.", "type": "service_unavailable"}}
        return 503, overloaded, {}, 0.0
    raise ValueError(f"no error reply for fault {kind!r}")

