"""Inference task: state the preference, decompose it, match checklists both ways -> P/R/F1.

Precision matches the inferred checklist against the ground-truth preference; recall
matches the ground-truth checklist against the inferred preference (paper §2.3).
"""

from __future__ import annotations

import asyncio

from cupid_exp.data.schema import Instance
from cupid_exp.parsing import parse_checklist, parse_match_labels, parse_preference
from cupid_exp.rendering import numbered
from cupid_exp.tasks.base import EvalContext, InstanceRecord, StepFailed, ask

_LABELS = ["Fully Covered", "Partially Covered", "Not Covered"]

# Constrained output for small local models: the sentence alone. Measured on SmolLM2-135M, asking for
# an analysis field first led to degenerate one-word "preferences"; API models answer in free text.
INFER_SCHEMA = {
    "type": "object",
    "properties": {"preference": {"type": "string", "minLength": 20, "maxLength": 300}},
    "required": ["preference"],
}
CHECKLIST_SCHEMA = {
    "type": "object",
    "properties": {"analysis": {"type": "string", "maxLength": 400},
                   "checklist": {"type": "array", "items": {"type": "string", "minLength": 5, "maxLength": 200},
                                 "minItems": 1, "maxItems": 4}},
    "required": ["analysis", "checklist"],
}


def match_schema(n_items: int) -> dict:
    item = {"type": "object",
            "properties": {"index": {"type": "integer"}, "entry": {"type": "string", "maxLength": 200},
                           "reasoning": {"type": "string", "maxLength": 240},
                           "label": {"type": "string", "enum": _LABELS}},
            "required": ["index", "entry", "reasoning", "label"]}
    return {"type": "object",
            "properties": {"results": {"type": "array", "items": item, "minItems": n_items, "maxItems": n_items}},
            "required": ["results"]}


def f1(precision: float, recall: float) -> float:
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


async def decompose(ctx: EvalContext, record: InstanceRecord, preference: str) -> list[str]:
    template = ctx.prompts.get("synthesis/preference_decomposer")
    messages = template.messages(ctx.decomposer.model.system_role, preferences=preference)
    return await ask(ctx, ctx.decomposer, record, "decompose", messages,
                     lambda text: parse_checklist(text), CHECKLIST_SCHEMA)


async def match(ctx: EvalContext, record: InstanceRecord, step: str, checklist: list[str],
                preference: str, examples: str) -> list[float]:
    template = ctx.prompts.get(ctx.matcher_prompt)
    messages = template.messages(ctx.matcher.model.system_role, checklist=numbered(checklist),
                                 preference=preference, examples=examples)
    n = len(checklist)
    return await ask(ctx, ctx.matcher, record, step, messages,
                     lambda text: parse_match_labels(text, n), match_schema(n))


async def run_inference(ctx: EvalContext, instance: Instance, log_text: str, record: InstanceRecord) -> None:
    """Fill ``record.values`` with the inferred preference, checklists, labels and P/R/F1."""
    template = ctx.prompts.get("evaluation/preference_inferrer")
    messages = template.messages(ctx.subject.model.system_role, interaction_log=log_text,
                                 curr_request=instance.current_request)
    preference = await ask(ctx, ctx.subject, record, "infer", messages, parse_preference, INFER_SCHEMA)
    record.values["inferred_preference"] = preference
    checklist = (await decompose(ctx, record, preference))[: ctx.max_checklist_items]
    record.values["inferred_checklist"] = checklist
    gt_checklist = list(instance.current_checklist)
    examples = ctx.matcher_examples
    outcomes = await asyncio.gather(
        match(ctx, record, "match_precision", checklist, instance.current_contextual_preference, examples),
        match(ctx, record, "match_recall", gt_checklist, preference, examples),
        return_exceptions=True,
    )
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    if failures:
        for extra in failures[1:]:
            if isinstance(extra, StepFailed):
                record.add_error(extra)
        raise failures[0]
    precision_labels, recall_labels = outcomes
    precision = sum(precision_labels) / len(precision_labels)
    recall = sum(recall_labels) / len(recall_labels)
    record.values.update(
        precision_labels=precision_labels, recall_labels=recall_labels,
        n_predicted=len(checklist), n_true=len(gt_checklist),
        predicted_matched=sum(precision_labels), true_matched=sum(recall_labels),
        precision=precision, recall=recall, f1=f1(precision, recall),
    )
