"""What a provider bills for each request it was sent, whatever its reply carries (or whether one came). Usage missing
from a reply is counted locally (estimated); a request lost after sending is charged its worst case."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cupid_exp.errors import causes
from cupid_exp.llm.messages import Message
from cupid_exp.llm.retry import is_connection_refused
from cupid_exp.llm.usage import WorstCase

if TYPE_CHECKING:
    from cupid_exp.llm.budget import Reservation


def lost_after_sending(exc: BaseException) -> bool:
    """Whether a failed request may have been billed without its reply reaching us: timed out, dropped after sending, or
    cancelled in flight. Not a connection never made, nor an HTTP error status."""
    import litellm
    import openai

    if not isinstance(exc, Exception):  # an interrupt (Terminated, KeyboardInterrupt) or a cancellation
        return True
    if isinstance(exc, (litellm.Timeout, asyncio.TimeoutError, TimeoutError)):
        return True
    if is_connection_refused(exc):
        return False
    # litellm reports a dropped connection as a 500 ("Connection error."): the transport's error is in the chain
    return any(isinstance(e, openai.APIConnectionError) for e in causes(exc))


def empty_reason(response: object) -> str | None:
    """Why ``response`` carries no completion (None if it does). A refusal or a cut reply is a reply."""
    if response is None:
        return f"got {type(response).__name__}; e.g. an HTTP 422 rejection"
    choices = getattr(response, "choices", None)
    if not choices:
        return "no choices"
    choice = choices[0]
    message = getattr(choice, "message", None)
    if getattr(choice, "finish_reason", None) in ("content_filter", "length"):
        return None
    if message is None or (getattr(message, "content", None) is None and not getattr(message, "refusal", None)
                           and not getattr(message, "tool_calls", None)
                           and not getattr(message, "function_call", None)):
        return "content null, no refusal and no tool call"
    return None


def field_of(obj: object, name: str) -> Any:
    """``obj[name]`` of a dict (a batch row's), else its attribute (litellm's objects); None where it has none."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def reply_text(choice: object) -> str:
    """Every output token of a choice: content, refusal, tool calls' arguments (an object or a batch row's dict)."""
    message = field_of(choice, "message") or {}
    parts = [field_of(message, "content"), field_of(message, "refusal")]
    for call in field_of(message, "tool_calls") or []:
        function = field_of(call, "function") or {}
        parts += [field_of(function, "name"), field_of(function, "arguments")]
    return "".join(p for p in parts if isinstance(p, str))


def counted_tokens(litellm_model: str, messages: list[Message], usage: object, text: str) -> tuple[int, int, bool]:
    """(prompt, completion, estimated): the reply's usage, else counted locally (a billed prompt is never 0 tokens)."""
    prompt, completion = (int(field_of(usage, key) or 0) for key in ("prompt_tokens", "completion_tokens"))
    if prompt > 0:
        return prompt, completion, False
    import litellm

    prompt = litellm.token_counter(model=litellm_model, messages=messages)
    completion = litellm.token_counter(model=litellm_model, text=text, count_response_tokens=True) if text else 0
    return int(prompt), int(completion), True


def token_cost(litellm_model: str, prompt: int, completion: int, prices: dict[str, float] | None) -> float | None:
    """The cost of these tokens at the config's prices (``prices``) or litellm's map; None for an unpriced model."""
    import litellm

    try:
        cost_in, cost_out = litellm.cost_per_token(model=litellm_model, prompt_tokens=prompt,
                                                   completion_tokens=completion, custom_cost_per_token=prices)
    except (litellm.exceptions.ModelNotMappedError, litellm.exceptions.BadRequestError,
            litellm.exceptions.NotFoundError, ValueError):
        return None
    return float(cost_in + cost_out)


@dataclass
class Reply:
    """A usable reply's tokens and cost, as billed (``estimated``: counted here, the reply had no usage)."""

    response: Any
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    estimated: bool
    cached: bool = False  #: served by the response cache: nothing billed


@dataclass
class CallBill:
    """What one call's attempts sent and were charged beyond the reply it returns (or fails with)."""

    step: str = ""
    worst: WorstCase = field(default_factory=WorstCase)  #: each request's worst case, counted while it is in flight
    sent: int = 0  #: requests sent (or looked up in the response cache)
    charged_usd: float = 0.0  #: attempts without a usable reply: a lost one's worst case, an empty one's cost
    charged: int = 0  #: how many attempts that is
    charged_tokens: tuple[int, int] = (0, 0)  #: their prompt and completion tokens (a lost one's worst case)
    held: Reservation | None = field(default=None, repr=False)  #: the next attempt's reservation, held before its slot

    def charge(self, usd: float | None, prompt: int = 0, completion: int = 0) -> None:
        if usd or prompt or completion:
            self.charged_usd += usd or 0.0
            self.charged += 1
            self.charged_tokens = (self.charged_tokens[0] + prompt, self.charged_tokens[1] + completion)

    def settled(self) -> dict[str, float]:
        """What the call's count adds beyond its reply: its requests settled and the charged attempts' tokens."""
        out = self.worst.in_flight(-self.sent)
        if any(self.charged_tokens):
            out.update(prompt_tokens=self.charged_tokens[0], completion_tokens=self.charged_tokens[1])
        return out

    def release_unused(self) -> None:
        """A reservation no request used (the call stopped while it waited for its slot): returned in full."""
        if self.held is not None:
            self.held.settle(0.0)
            self.held = None
