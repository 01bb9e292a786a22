"""Settings decide what the model sees of an instance's history (paper §4.1).

standard: every prior session; oracle: only those sharing the current context factor
and preference; oracle_preference (generation only): the true preference instead of
inferring it; summary: the model's own per-session summaries instead of the dialogues.
"""

from __future__ import annotations

import asyncio
import logging

from cupid_exp.config import SettingConfig
from cupid_exp.data.schema import Instance, PriorSession, normalize_text
from cupid_exp.parsing import parse_summaries
from cupid_exp.rendering import interaction_log, summary_log

log = logging.getLogger(__name__)

TASKS_PER_SETTING = {
    "standard": ("inference", "generation", "both"),
    "oracle": ("inference", "generation", "both"),
    "summary": ("inference", "generation", "both"),
    "oracle_preference": ("generation",),
    "retrieval": ("inference", "generation", "both"),
}
RETRIEVAL_FIELDS = ("retriever", "top_k", "embedding_model")  # meaningful only for setting=retrieval


class ConfigError(ValueError):
    """A combination of choices that cannot run; raised before any model call."""


def validate_combination(task: str, setting: str) -> None:
    if setting not in TASKS_PER_SETTING:
        raise ConfigError(f"setting={setting} is unknown; choose one of {sorted(TASKS_PER_SETTING)}")
    if task not in TASKS_PER_SETTING[setting]:
        valid = ", ".join(f"task={t} setting={s}" for s, ts in TASKS_PER_SETTING.items() for t in ts)
        raise ConfigError(f"task={task} cannot run with setting={setting} (it is defined for "
                          f"{'/'.join(TASKS_PER_SETTING[setting])} only); valid combinations: {valid}")


def relevant_positions(instance: Instance) -> list[int]:
    """1-based positions of prior sessions sharing the current context factor and preference."""
    factor = normalize_text(instance.current_context_factor)
    preference = normalize_text(instance.current_contextual_preference)
    return [i for i, s in enumerate(instance.prior_interactions, start=1)
            if normalize_text(s.context_factor) == factor and normalize_text(s.contextual_preference) == preference]


def shown_positions(instance: Instance, setting: SettingConfig) -> list[int]:
    """1-based positions of the prior sessions the setting shows, in their original order."""
    if setting.name == "oracle":
        return relevant_positions(instance)
    if setting.name == "retrieval":
        from cupid_exp.retrieval import retrieve

        return retrieve(instance, setting)
    return list(range(1, len(instance.prior_interactions) + 1))


def select_sessions(instance: Instance, setting: SettingConfig) -> list[PriorSession]:
    """The prior sessions the setting shows, in their original order."""
    return [instance.prior_interactions[i - 1] for i in shown_positions(instance, setting)]


def summary_schema(n_sessions: int) -> dict:
    item = {"type": "object",
            "properties": {"session_id": {"type": "integer"}, "analysis": {"type": "string", "maxLength": 300},
                           "context": {"type": "array", "items": {"type": "string", "maxLength": 200},
                                       "minItems": 1, "maxItems": 3},
                           "preferences": {"type": "array", "items": {"type": "string", "maxLength": 200},
                                           "minItems": 1, "maxItems": 3}},
            "required": ["session_id", "analysis", "context", "preferences"]}
    return {"type": "object",
            "properties": {"summaries": {"type": "array", "items": item, "minItems": n_sessions,
                                         "maxItems": n_sessions}},
            "required": ["summaries"]}


async def context_text(ctx, instance: Instance, sessions: list[PriorSession], setting: SettingConfig,
                       record) -> str:
    """The text that fills the prompts' {interaction_log}: the dialogues, or their summaries.

    A summary is computed once per instance within a job (shared by both tasks) and, via
    the response cache, once per (model, instance) across jobs and reruns.
    """
    if setting.name != "summary":
        return interaction_log(sessions)
    if instance.key not in ctx.summaries:
        ctx.summaries[instance.key] = asyncio.ensure_future(_summarize(ctx, sessions, setting, record))
    summaries = await ctx.summaries[instance.key]
    record.values["summaries"] = summaries
    return summary_log(summaries)


async def _summarize(ctx, sessions: list[PriorSession], setting: SettingConfig, record) -> list[dict]:
    from cupid_exp.tasks.base import ask

    template = ctx.prompts.get("evaluation/session_summarizer")
    messages = template.messages(ctx.subject.model.system_role, interaction_log=interaction_log(sessions))
    n = len(sessions)
    return await ask(ctx, ctx.subject, record, "summarize", messages, lambda text: parse_summaries(text, n),
                     summary_schema(n), params=dict(setting.summary_params))
