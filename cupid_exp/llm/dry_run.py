"""Dry run: render every prompt and count calls, tokens and cost without calling a model.

Each step gets a placeholder reply shaped so the pipeline proceeds exactly as a real run
would (same steps, same number of calls); token counts come from litellm's tokenizers
and the estimated cost from litellm's price map.
"""

from __future__ import annotations

import json
import re

PLACEHOLDER = "(dry run)"


def _numbered_items(messages: list[dict]) -> int:
    text = messages[-1]["content"] if messages else ""
    section = text.split("Checklist")[-1]
    return max(1, len(re.findall(r"(?m)^\s*\d+\.\s", section)))


def _sessions(messages: list[dict]) -> int:
    return max(1, len(re.findall(r"(?m)^### Session \d+", messages[-1]["content"] if messages else "")))


def placeholder_reply(step: str, messages: list[dict], n_checklist: int = 3) -> str:
    """A reply the step's parser accepts, so the next steps run as they would for real."""
    if step == "infer":
        return f"### Analysis\n\n{PLACEHOLDER}\n\n### Most Likely Preference\n\nThe user prefers {PLACEHOLDER}."
    if step == "decompose":
        items = [f"Does the response follow {PLACEHOLDER} item {i + 1}?" for i in range(n_checklist)]
        return json.dumps({"analysis": PLACEHOLDER, "checklist": items})
    if step.startswith("match"):
        n = _numbered_items(messages)
        return json.dumps({"results": [{"index": i + 1, "entry": PLACEHOLDER, "reasoning": PLACEHOLDER,
                                        "label": "Partially Covered"} for i in range(n)]})
    if step == "judge":
        return f"### Evaluation of AI Assistant's Response\n\n{PLACEHOLDER}\n\n### Evaluation Score\n\n5"
    if step == "summarize":
        n = _sessions(messages)
        return json.dumps({"summaries": [{"session_id": i + 1, "analysis": PLACEHOLDER, "context": [PLACEHOLDER],
                                          "preferences": [PLACEHOLDER]} for i in range(n)]})
    return PLACEHOLDER


def estimate(model: str, messages: list[dict], max_tokens: int | None, completion_estimate: int,
             input_cost: float | None = None, output_cost: float | None = None) -> tuple[int, int, float | None]:
    """(prompt tokens, estimated completion tokens, estimated cost or None when unpriced)."""
    import litellm

    try:
        prompt_tokens = int(litellm.token_counter(model=model, messages=messages))
    except Exception:  # unknown tokenizer: litellm's default
        prompt_tokens = int(litellm.token_counter(messages=messages))
    completion_tokens = min(completion_estimate, max_tokens) if max_tokens else completion_estimate
    if input_cost is not None and output_cost is not None:
        return prompt_tokens, completion_tokens, prompt_tokens * input_cost + completion_tokens * output_cost
    try:
        cost_in, cost_out = litellm.cost_per_token(model=model, prompt_tokens=prompt_tokens,
                                                   completion_tokens=completion_tokens)
        return prompt_tokens, completion_tokens, float(cost_in + cost_out)
    except Exception:  # not in the price map
        return prompt_tokens, completion_tokens, None
