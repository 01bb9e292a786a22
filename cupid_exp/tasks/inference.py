"""Inference task: state the preference, decompose it, match checklists both ways -> P/R/F1 (paper §2.3)."""

from __future__ import annotations

import asyncio
import re

from cupid_exp.data.schema import Instance
from cupid_exp.llm.dry_run import PLACEHOLDER
from cupid_exp.llm.replies import ParseError, excerpt, parse_json_reply, strip_thinking
from cupid_exp.llm.steps import StepFailed, Transcript, ask
from cupid_exp.results import InferenceResult
from cupid_exp.scoring.statistics import harmonic_mean
from cupid_exp.settings.base import View
from cupid_exp.tasks.context import TaskContext

# Constrained output for small local models: the sentence alone. Measured on SmolLM2-135M, asking for
# an analysis field first led to degenerate one-word "preferences"; API models answer in free text.
INFER_SCHEMA = {
    "type": "object",
    "properties": {"preference": {"type": "string", "minLength": 20, "maxLength": 300}},
    "required": ["preference"],
}

# "### Most Likely Preference", "**Most Likely Preferences:**", "most likely preference: ...". A prose
# line that merely starts with those words ("Most likely preference is the one from session 3, ...") is
# not a header: it needs header markup, a colon, or nothing else on the line.
_PREFERENCE_HEADER = re.compile(
    r"^[ \t>]*(?P<hashes>#{1,6}[ \t]*)?(?P<bold>\*\*|__)?[ \t]*most[ \t]+likely[ \t]+prefer\w*[ \t]*(?:\*\*|__)?"
    r"[ \t]*(?P<colon>:)?[ \t]*(?:\*\*|__)?[ \t]*(?P<rest>.*)$",
    re.IGNORECASE | re.MULTILINE)
_HEADER_LINE = re.compile(r"^\s*#{1,6}\s")
_BOLD_LINE = re.compile(r"^\s*\*\*(?P<inner>[^*]+)\*\*\s*(?P<colon>:?)\s*$")
_SECTION_NAMES = {"analysis", "reasoning", "explanation", "rationale", "justification", "confidence", "notes",
                  "note", "evidence", "summary", "answer"}


def _is_header(line: str) -> bool:
    """A markdown header, or a bold section label ('**Confidence:**', '**Notes**'); not a bolded sentence."""
    if _HEADER_LINE.match(line):
        return True
    bold = _BOLD_LINE.match(line)
    if not bold:
        return False
    inner = bold.group("inner").strip()
    return bool(bold.group("colon")) or inner.endswith(":") or inner.lower() in _SECTION_NAMES


def _clean_sentence(text: str) -> str:
    text = text.strip().strip("*_").strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'“”":
        text = text[1:-1]
    return text.strip().strip("\"“”").strip()


def parse_preference(text: str) -> str:
    """The stated preference, from JSON or under the last 'Most Likely Preference(s)' header."""
    body = strip_thinking(text)
    if body.lstrip().startswith(("{", "```")):
        try:
            data = parse_json_reply(body)
        except ParseError:
            data = None
        if isinstance(data, dict):
            for key in ("preference", "most_likely_preference", "most_likely_preferences"):
                value = data.get(key)
                if isinstance(value, str) and value.strip():
                    return _clean_sentence(value)
    headers = [m for m in _PREFERENCE_HEADER.finditer(body)
               if m.group("hashes") or m.group("bold") or m.group("colon") or not m.group("rest").strip()]
    if not headers:
        raise ParseError(f"no 'Most Likely Preference' section in reply: {excerpt(body)}")
    header = headers[-1]
    rest = _clean_sentence(header.group("rest"))
    if rest:
        return rest
    for line in body[header.end():].splitlines():
        if _is_header(line):
            break
        line = _clean_sentence(line.lstrip("-*> \t"))
        if line:
            return line
    raise ParseError("the 'Most Likely Preference' section is empty")


def _dry_preference(messages: list[dict]) -> str:
    return f"### Analysis\n\n{PLACEHOLDER}\n\n### Most Likely Preference\n\nThe user prefers {PLACEHOLDER}."


async def run_inference(ctx: TaskContext, instance: Instance, view: View, transcript: Transcript) -> InferenceResult:
    """Infer, decompose, match both ways; a failed step ends the task with what was reached so far."""
    messages = ctx.prompts.get("evaluation/preference_inferrer").messages(
        ctx.subject.model.system_role, format_system=False, interaction_log=view.log_text,
        curr_request=instance.current_request)
    preference = checklist = None
    try:
        preference = await ask(ctx.subject, "infer", messages, parse_preference, transcript=transcript,
                               schema=INFER_SCHEMA, retry=ctx.retry, dry_reply=_dry_preference)
        checklist = await ctx.evaluator.checklist(preference, transcript)
        gt_checklist = list(instance.current_checklist)
        outcomes = await asyncio.gather(
            ctx.evaluator.match("match_precision", checklist, instance.current_contextual_preference, transcript),
            ctx.evaluator.match("match_recall", gt_checklist, preference, transcript),
            return_exceptions=True)
    except StepFailed as exc:
        transcript.fail(exc)
        return InferenceResult(inferred_preference=preference, inferred_checklist=checklist)
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    for failure in failures:
        if not isinstance(failure, StepFailed):
            raise failure  # a bug in one direction: stop, do not count it
        transcript.fail(failure)
    if failures:
        return InferenceResult(inferred_preference=preference, inferred_checklist=checklist)
    precision_labels, recall_labels = outcomes
    precision = sum(precision_labels) / len(precision_labels)
    recall = sum(recall_labels) / len(recall_labels)
    return InferenceResult(
        inferred_preference=preference, inferred_checklist=checklist,
        precision_labels=precision_labels, recall_labels=recall_labels,
        n_predicted=len(checklist), n_true=len(gt_checklist),
        predicted_matched=sum(precision_labels), true_matched=sum(recall_labels),
        precision=precision, recall=recall, f1=harmonic_mean(precision, recall))
