"""Every model call: litellm clients, usage accounting, and the shared ask → parse → re-ask step."""

from cupid_exp.llm.client import LLMClient, clients_for, configure_litellm
from cupid_exp.llm.errors import ProviderError, provider_error_kind
from cupid_exp.llm.replies import Invalid, ParseError, parse_json_reply, strip_thinking
from cupid_exp.llm.steps import Reask, Resample, StepFailed, Transcript, ask
from cupid_exp.llm.usage import Completion, UsageMeter, usage_metrics

__all__ = ["Completion", "Invalid", "LLMClient", "ParseError", "ProviderError", "Reask", "Resample", "StepFailed",
           "Transcript", "UsageMeter", "ask", "clients_for", "configure_litellm", "parse_json_reply",
           "provider_error_kind", "strip_thinking", "usage_metrics"]
