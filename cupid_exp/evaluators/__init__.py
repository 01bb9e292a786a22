"""The evaluator (paper §2.3): decomposer, matcher and judge with their prompts, hidden from the tasks."""

from __future__ import annotations

from dataclasses import dataclass

from cupid_exp.evaluators.checklist import decompose, dry_match, match_schema, parse_match_labels
from cupid_exp.evaluators.judge import JUDGE_SCHEMA, dry_judgment, parse_judge_score
from cupid_exp.llm.client import LLMClient
from cupid_exp.llm.steps import Reask, Transcript, ask
from cupid_exp.prompts import PromptSet
from cupid_exp.rendering import bulleted, numbered


@dataclass
class Evaluator:
    decomposer: LLMClient
    matcher: LLMClient
    judge: LLMClient
    prompts: PromptSet
    matcher_prompt: str = "evaluation/preference_matcher"
    matcher_examples: str | None = ""  # the rendered few-shot block for the matcher's {examples}; None: none
    max_checklist_items: int = 4
    retry: Reask = Reask(1)

    async def checklist(self, preference: str, transcript: Transcript) -> list[str]:
        """The preference as yes/no checklist items (at most ``max_checklist_items``)."""
        return await decompose(self.decomposer, self.prompts, preference, transcript=transcript, retry=self.retry,
                               max_items=self.max_checklist_items)

    async def match(self, step: str, checklist: list[str], preference: str, transcript: Transcript) -> list[float]:
        """1 / 0.5 / 0 per checklist item: how far ``preference`` covers it."""
        messages = self.prompts.get(self.matcher_prompt).messages(
            self.matcher.model.system_role, checklist=numbered(checklist), preference=preference,
            examples=self.matcher_examples)
        n = len(checklist)
        return await ask(self.matcher, step, messages, lambda text: parse_match_labels(text, n),
                         transcript=transcript, schema=match_schema(n), retry=self.retry, dry_reply=dry_match(n))

    async def score(self, preference: str, checklist: list[str], request: str, response: str,
                    transcript: Transcript) -> float:
        """The judge's 1–10 score of ``response`` against the true preference and checklist."""
        messages = self.prompts.get("evaluation/response_judger").messages(
            self.judge.model.system_role, preference=preference, checklist=bulleted(checklist),
            user_request=request, ai_response=response)
        return await ask(self.judge, "judge", messages, parse_judge_score, transcript=transcript,
                         schema=JUDGE_SCHEMA, retry=self.retry, dry_reply=dry_judgment)
