"""Step 4 (paper B.4): each preference as a yes/no checklist, by the evaluator's own decomposition step.

Synthesis and evaluation share the prompt, the schema and the parser (``evaluators.checklist``);
synthesis adds the checks a dataset row needs on top: no copied placeholders (dropped beside real
questions, refused alone), no duplicates, every entry a real question, at most
``synthesis.max_checklist_items`` of them.
"""

from __future__ import annotations

from typing import Callable

from cupid_exp.evaluators.checklist import decompose as decompose_preference
from cupid_exp.evaluators.checklist import parse_checklist
from cupid_exp.llm.replies import Invalid
from cupid_exp.llm.steps import Transcript
from cupid_exp.synthesis.steps.base import PLACEHOLDER_REASON, SynthContext
from cupid_exp.synthesis.steps.checks import placeholders


def checklist_parser(max_items: int) -> Callable[[str], list[str]]:
    """``parse_checklist`` plus the data checks; duplicates go before the cut to ``max_items``."""
    def parse(reply: str) -> list[str]:
        items = parse_checklist(reply)
        # a placeholder copied from the prompt's example beside real questions is dropped (a tiny model
        # often appends one); a list of placeholders only is refused and asked again
        real = [x for x in items if not placeholders(x)]
        if not real:
            raise Invalid(PLACEHOLDER_REASON)
        cleaned = list(dict.fromkeys(" ".join(x.split()) for x in real))[:max_items]
        if any(len(x) < 8 for x in cleaned):
            raise Invalid("every checklist entry must be a yes/no question")
        return cleaned

    return parse


async def decompose(ctx: SynthContext, preference: str) -> list[str]:
    return await decompose_preference(ctx.clients["decomposer"], ctx.prompts, preference, transcript=Transcript(),
                                      retry=ctx.retry, max_items=ctx.max_checklist_items,
                                      parse=checklist_parser(ctx.max_checklist_items))
