"""Which providers have a Batch API litellm can drive: the client asks before it batches a model's calls."""

from __future__ import annotations

BATCH_PROVIDERS = {"openai": "openai", "azure": "azure", "hosted_vllm": "hosted_vllm"}


def batch_provider(litellm_model: str) -> str | None:
    """litellm's provider name for the Batch API of ``<provider>/<model>``, or None without one."""
    return BATCH_PROVIDERS.get(litellm_model.split("/", 1)[0])
