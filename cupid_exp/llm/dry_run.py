"""Dry run: placeholder replies that parse (``dry_reply``), so the estimate counts the calls a real run makes."""

from __future__ import annotations

from cupid_exp.llm.messages import Message

PLACEHOLDER = "(dry run)"


def estimate(model: str, messages: list[Message], max_tokens: int | None, completion_estimate: int,
             input_cost: float | None = None, output_cost: float | None = None) -> tuple[int, int, float | None]:
    """(prompt tokens, estimated completion tokens, estimated cost or None when unpriced)."""
    import litellm

    try:
        prompt_tokens = int(litellm.token_counter(model=model, messages=messages))
    except (ValueError, KeyError, litellm.exceptions.BadRequestError):  # unknown tokenizer: litellm's default
        prompt_tokens = int(litellm.token_counter(messages=messages))
    completion_tokens = min(completion_estimate, max_tokens) if max_tokens else completion_estimate
    if input_cost is not None and output_cost is not None:
        return prompt_tokens, completion_tokens, prompt_tokens * input_cost + completion_tokens * output_cost
    try:
        cost_in, cost_out = litellm.cost_per_token(model=model, prompt_tokens=prompt_tokens,
                                                   completion_tokens=completion_tokens)
        return prompt_tokens, completion_tokens, float(cost_in + cost_out)
    except (litellm.exceptions.ModelNotMappedError, litellm.exceptions.BadRequestError,
            litellm.exceptions.NotFoundError):  # not in the price map
        return prompt_tokens, completion_tokens, None
