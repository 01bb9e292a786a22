"""Generation task: answer the current request, then a judge scores it 1–10 against the true
preference and checklist (paper §2.3). The judge's score is kept exactly as written."""

from __future__ import annotations

from cupid_exp.data.schema import Instance
from cupid_exp.parsing import parse_judge_score, strip_thinking
from cupid_exp.rendering import bulleted
from cupid_exp.tasks.base import EvalContext, InstanceRecord, ask

JUDGE_SCHEMA = {
    "type": "object",
    "properties": {"evaluation": {"type": "string", "maxLength": 800},
                   "score": {"type": "number", "minimum": 1, "maximum": 10}},
    "required": ["evaluation", "score"],
}


def _response(text: str) -> str:
    response = strip_thinking(text)
    if not response:
        from cupid_exp.parsing import ParseError

        raise ParseError("the response is empty")
    return response


def generation_messages(ctx: EvalContext, instance: Instance, log_text: str, setting_name: str,
                        include_log: bool) -> list[dict]:
    role = ctx.subject.model.system_role
    if setting_name == "oracle_preference":
        name = "evaluation/response_generator_oracle_preference" + ("_log" if include_log else "")
        return ctx.prompts.get(name).messages(role, preference=instance.current_contextual_preference,
                                              curr_request=instance.current_request, interaction_log=log_text)
    return ctx.prompts.get("evaluation/response_generator").messages(
        role, interaction_log=log_text, curr_request=instance.current_request)


async def run_generation(ctx: EvalContext, instance: Instance, log_text: str, record: InstanceRecord, *,
                         setting_name: str = "standard", include_log: bool = False) -> None:
    """Fill ``record.values`` with the response and the judge's score."""
    messages = generation_messages(ctx, instance, log_text, setting_name, include_log)
    response = await ask(ctx, ctx.subject, record, "generate", messages, _response)
    record.values["response"] = response
    judge = ctx.prompts.get("evaluation/response_judger").messages(
        ctx.judge.model.system_role, preference=instance.current_contextual_preference,
        checklist=bulleted(instance.current_checklist), user_request=instance.current_request,
        ai_response=response)
    record.values["judge_score"] = await ask(ctx, ctx.judge, record, "judge", judge, parse_judge_score,
                                             JUDGE_SCHEMA)
