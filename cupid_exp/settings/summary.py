"""summary: the evaluated model summarises each prior session first (paper §4.1, Fig. 23) and the task runs on the
summaries. One summary call per instance, shared by both tasks and cached across jobs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict

from cupid_exp.config import SettingConfig
from cupid_exp.llm.dry_run import PLACEHOLDER
from cupid_exp.llm.replies import ParseError, counted_list, string_list
from cupid_exp.llm.steps import ask
from cupid_exp.rendering import interaction_log, summary_log
from cupid_exp.results import SettingOutput
from cupid_exp.settings import register
from cupid_exp.settings.base import Setting, View

SUMMARIZER_PROMPT = "evaluation/session_summarizer"


@dataclass
class SummaryConfig(SettingConfig):
    name: str = "summary"
    summary_params: Dict[str, Any] = field(default_factory=dict)  # overrides of the model's params, this call only


def summary_schema(n_sessions: int) -> dict:
    strings = {"type": "array", "items": {"type": "string", "maxLength": 200}, "minItems": 1, "maxItems": 3}
    item = {"type": "object",
            "properties": {"session_id": {"type": "integer"}, "analysis": {"type": "string", "maxLength": 300},
                           "context": strings, "preferences": strings},
            "required": ["session_id", "analysis", "context", "preferences"]}
    return {"type": "object",
            "properties": {"summaries": {"type": "array", "items": item, "minItems": n_sessions,
                                         "maxItems": n_sessions}},
            "required": ["summaries"]}


def parse_summaries(text: str, n_sessions: int) -> list[dict[str, Any]]:
    """The summariser's {'summaries': [...]}: one entry per session with context and preferences lists."""
    items = counted_list(text, "summaries", n_sessions, "summary", "sessions")
    out = []
    for i, item in enumerate(items, start=1):
        if not isinstance(item, dict) or "context" not in item or "preferences" not in item:
            raise ParseError(f"summary {i} lacks 'context' or 'preferences' lists")
        out.append({"session_id": i, "context": string_list(item["context"], f"summaries[{i}].context"),
                    "preferences": string_list(item["preferences"], f"summaries[{i}].preferences")})
    return out


@register
class Summary(Setting):
    Config = SummaryConfig
    stages = ("summary",)

    def own_prompts(self) -> dict[str, set[str]]:
        return {SUMMARIZER_PROMPT: {"interaction_log"}}

    async def view(self, instance, ctx, transcript) -> View:
        positions = self.positions(instance)
        sessions = self.sessions(instance, positions)
        messages = ctx.prompts.get(SUMMARIZER_PROMPT).messages(
            ctx.subject.model.system_role, interaction_log=interaction_log(sessions))
        n = len(sessions)
        dry = json.dumps({"summaries": [{"session_id": i + 1, "analysis": PLACEHOLDER, "context": [PLACEHOLDER],
                                         "preferences": [PLACEHOLDER]} for i in range(n)]})
        summaries = await ask(ctx.subject, "summarize", messages, lambda text: parse_summaries(text, n),
                              transcript=transcript, schema=summary_schema(n), params=dict(self.config.summary_params),
                              retry=ctx.retry, dry_reply=lambda messages: dry)
        return View(summary_log(summaries), positions, output=SettingOutput(summaries=summaries))
