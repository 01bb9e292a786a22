"""Generation task: answer the current request; the judge scores it 1–10 (paper §2.3)."""

from __future__ import annotations

from cupid_exp.data.schema import Instance
from cupid_exp.llm.dry_run import PLACEHOLDER
from cupid_exp.llm.replies import ParseError, strip_thinking
from cupid_exp.llm.steps import StepFailed, Transcript, ask
from cupid_exp.results import GenerationResult
from cupid_exp.settings.base import View
from cupid_exp.tasks.context import TaskContext


def parse_response(text: str) -> str:
    """The answer as delivered to the user, reasoning blocks removed; an empty answer is unusable."""
    response = strip_thinking(text)
    if not response:
        raise ParseError("the response is empty")
    return response


async def run_generation(ctx: TaskContext, instance: Instance, view: View, transcript: Transcript
                         ) -> GenerationResult:
    """Generate with the setting's prompt, then judge; a failed step ends the task with what was reached."""
    messages = ctx.prompts.get(view.generation_prompt).messages(
        ctx.subject.model.system_role, format_system=False, interaction_log=view.log_text,
        curr_request=instance.current_request, **view.generation_values)
    response = None
    try:
        response = await ask(ctx.subject, "generate", messages, parse_response, transcript=transcript,
                             retry=ctx.retry, dry_reply=lambda _: f"A response ({PLACEHOLDER}).")
        score = await ctx.evaluator.score(instance.current_contextual_preference, list(instance.current_checklist),
                                          instance.current_request, response, transcript)
    except StepFailed as exc:
        transcript.fail(exc)
        return GenerationResult(response=response)
    return GenerationResult(response=response, judge_score=score)
