"""Dry run: placeholder replies that parse (``dry_reply``), so the estimate counts the calls a real run makes."""

from __future__ import annotations

import contextlib

from cupid_exp.config import ModelConfig
from cupid_exp.llm.messages import Message

PLACEHOLDER = "(dry run)"


def estimate(model: ModelConfig, messages: list[Message], max_tokens: int | None, completion_estimate: int
             ) -> tuple[int, int, float | None]:
    """(prompt tokens, estimated completion tokens, estimated cost or None when unpriced): the config's prices,
    else litellm's map."""
    import litellm

    try:
        prompt_tokens = int(litellm.token_counter(model=model.litellm_model, messages=messages))
    except (ValueError, KeyError, litellm.exceptions.BadRequestError):  # unknown tokenizer: litellm's default
        prompt_tokens = int(litellm.token_counter(messages=messages))
    completion_tokens = min(completion_estimate, max_tokens) if max_tokens else completion_estimate
    given = model.model_info
    if given.input_cost_per_token is not None and given.output_cost_per_token is not None:
        return prompt_tokens, completion_tokens, (prompt_tokens * given.input_cost_per_token
                                                  + completion_tokens * given.output_cost_per_token)
    with contextlib.suppress(litellm.exceptions.ModelNotMappedError, litellm.exceptions.BadRequestError,
                             litellm.exceptions.NotFoundError):  # not in the price map
        cost_in, cost_out = litellm.cost_per_token(model=model.litellm_model, prompt_tokens=prompt_tokens,
                                                   completion_tokens=completion_tokens)
        return prompt_tokens, completion_tokens, float(cost_in + cost_out)
    return prompt_tokens, completion_tokens, None
