"""What the synthesis tests share: a scripted model server, a SynthContext on it, and wrong-shaped JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from cupid_exp.config import CallsConfig, ModelConfig
from cupid_exp.llm.client import LLMClient, configure_litellm
from cupid_exp.llm.replies import ParseError
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.prompts import PromptSet
from cupid_exp.synthesis.config import ROLES
from cupid_exp.synthesis.steps import SynthContext
from cupid_exp.testing.fault_server import ScriptedServer, completion_body
from cupid_exp.testing.inprocess import InProcessModel

__all__ = ["ScriptedServer", "WRONG_SHAPES", "assert_rejected", "completion_body", "context", "counts", "reply",
           "role_overrides"]

# JSON that is not the object a builder expects: each must give ParseError, never TypeError/KeyError.
WRONG_SHAPES = [[], [1, 2], ["a string in a list"], "just text", None, 7, True, {}, {"unrelated": "key"}]


def reply(payload: Any) -> tuple:
    """One scripted 200 answer: ``payload`` as the reply text (JSON-encoded unless it is a string)."""
    return 200, completion_body(payload if isinstance(payload, str) else json.dumps(payload)), {}


def context(url: str, tmp_path: Path, max_retries: int = 2, structured: bool = False, **knobs: Any) -> SynthContext:
    """Every role on one model at ``url`` (``structured``: JSON schemas sent, as the stub server needs);
    the shared meter is ``ctx.clients['persona_writer'].meter``."""
    runtime = CallsConfig(cache_dir=str(tmp_path / "cache"), cache=True, num_retries=0, timeout=10)
    configure_litellm(runtime)
    model = ModelConfig(name="scripted", litellm_model="openai/scripted", api_base=url, params={"temperature": 0.7},
                        structured_output=structured)
    client = LLMClient(model, runtime, UsageMeter())
    return SynthContext(clients={r: client for r in ROLES}, prompts=PromptSet(), max_retries=max_retries, **knobs)


def counts(ctx: SynthContext, step: str) -> dict[str, float]:
    return dict(ctx.clients["persona_writer"].meter.counts[step])


def assert_rejected(build: Callable[[Any], Any], data: Any) -> None:
    """``build`` refuses ``data`` with a ParseError (Invalid included), the only errors a re-ask handles."""
    with pytest.raises(ParseError):
        build(data)


def role_overrides(url: str | InProcessModel, *, structured: bool = True) -> list[str]:
    """CLI overrides that put every synthesis role on the OpenAI-compatible server at ``url`` (or in-process)."""
    model, base = (url.litellm_model, "null") if isinstance(url, InProcessModel) else ("openai/stub", url)
    out = []
    for role in ROLES:
        out += [f"llm@synthesis.roles.{role}=openai_compatible", f"synthesis.roles.{role}.litellm_model={model}",
                f"synthesis.roles.{role}.api_base={base}"]
        if structured:  # the stub answers synthesis steps from the request's JSON schema
            out.append(f"synthesis.roles.{role}.structured_output=true")
    return out
