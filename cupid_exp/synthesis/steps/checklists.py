"""Step 4 (paper B.4): each preference as a yes/no checklist, by the evaluator's decomposition, plus a dataset row's
checks: no placeholders, no fragments, no duplicates, at most ``synthesis.max_checklist_items``."""

from __future__ import annotations

from typing import Callable

from cupid_exp.evaluators.checklist import decompose as decompose_preference
from cupid_exp.evaluators.checklist import parse_checklist
from cupid_exp.llm.replies import Invalid
from cupid_exp.llm.steps import Transcript
from cupid_exp.synthesis.steps.base import PLACEHOLDER_REASON, SynthContext
from cupid_exp.synthesis.steps.checks import placeholders

MIN_QUESTION = 8  #: characters: shorter is a fragment ("Depth", "prefers"), not a yes/no question


def checklist_parser(max_items: int) -> Callable[[str], list[str]]:
    """``parse_checklist`` plus the data checks; duplicates and fragments go before the cut to ``max_items``."""
    def parse(reply: str) -> list[str]:
        items = parse_checklist(reply)
        # a placeholder copied from the prompt's example beside real questions is dropped (a tiny model
        # often appends one); a list of placeholders only is refused and asked again
        real = [x for x in items if not placeholders(x)]
        if not real:
            raise Invalid(PLACEHOLDER_REASON)
        # so is a fragment beside real questions (SmolLM2-135M's ["Tailwind", "NuBoom"]: seed 0's first persona
        # failed there, each of its four attempts refused for one fragment)
        cleaned = [x for x in dict.fromkeys(" ".join(x.split()) for x in real) if len(x) >= MIN_QUESTION]
        if not cleaned:
            raise Invalid("every checklist entry must be a yes/no question")
        return cleaned[:max_items]

    return parse


async def decompose(ctx: SynthContext, preference: str) -> list[str]:
    return await decompose_preference(ctx.clients["decomposer"], ctx.prompts, preference, transcript=Transcript(),
                                      retry=ctx.retry, max_items=ctx.max_checklist_items,
                                      parse=checklist_parser(ctx.max_checklist_items))
