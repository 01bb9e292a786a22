"""What a task needs besides the instance and view: subject model, evaluator, prompts and re-ask policy."""

from __future__ import annotations

from dataclasses import dataclass

from cupid_exp.evaluators import Evaluator
from cupid_exp.llm.client import LLMClient
from cupid_exp.llm.steps import Reask
from cupid_exp.prompts import PromptSet


@dataclass(frozen=True)
class TaskContext:
    subject: LLMClient  #: the evaluated model
    evaluator: Evaluator  #: decomposer, matcher and judge
    prompts: PromptSet
    retry: Reask = Reask(1)
