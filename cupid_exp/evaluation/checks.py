"""What an evaluation job checks before its first call: its prompt files, the matcher's examples, a model server."""

from __future__ import annotations

from typing import Iterable

from cupid_exp.config import RunConfig
from cupid_exp.job.checks import check_prompts
from cupid_exp.llm.server import check_server_command
from cupid_exp.prompts import PromptSet
from cupid_exp.settings.base import Setting

# The placeholders each step fills, by prompt file (a drop-in prompt may use fewer, never others).
STEP_PROMPTS = {
    "inference": {"evaluation/preference_inferrer": {"interaction_log", "curr_request"},
                  "synthesis/preference_decomposer": {"preferences"}},
    "generation": {"evaluation/response_judger": {"preference", "checklist", "user_request", "ai_response"}},
}
MATCHER_FIELDS = {"checklist", "preference", "examples"}
GENERATOR_FIELDS = {"interaction_log", "curr_request"}


def prompts_needed(cfg: RunConfig, setting: Setting, parts: Iterable[str]) -> dict[str, set[str]]:
    """Every prompt file the job will send, with the placeholders the sending step fills."""
    needed = dict(setting.own_prompts())
    for part in parts:
        needed.update(STEP_PROMPTS[part])
    if "inference" in parts:
        needed[cfg.evaluator.matcher_prompt] = MATCHER_FIELDS
    if "generation" in parts:
        needed[setting.generation_prompt] = GENERATOR_FIELDS | setting.generation_fields
    return needed


def check_evaluation(cfg: RunConfig, setting: Setting, prompts: PromptSet) -> None:
    """The evaluation job's own checks (``job.checks.check_before_calls`` has run those of every job)."""
    parts = tuple(cfg.task.parts)
    check_prompts(prompts, prompts_needed(cfg, setting, parts))
    if cfg.evaluator.matcher_few_shot:  # read with the clients (``EvaluationWork.connect``): a drop-in's own
        prompts.matcher_examples()  # examples or the official module's, never ours; ConfigError in one line
    if not cfg.runtime.dry_run:  # a dry run starts no server
        check_server_command(cfg.evaluator.server)

