"""Typed results of one instance and their instances.jsonl line; a field never reached is absent, not null."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

#: A text longer than this (a reply of megabytes) is kept whole once on disk by us: in the journal line of its record
#: (the parsed answer; what resume reads, with or without the response cache); every other copy is its ``preview``.
LONG_TEXT = 64 * 1024
_PREVIEW = 2000


def preview(text: Any) -> Any:
    """A text up to ``LONG_TEXT`` as it is; longer, its first 2,000 characters with its length and sha256."""
    if not isinstance(text, str) or len(text) <= LONG_TEXT:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{text[:_PREVIEW]}\n[cut here: {len(text)} characters in all, sha256 {digest}]"


def previewed(value: Any, quoted: tuple[str, ...] | None = None) -> Any:
    """``preview`` of every string in a container; with ``quoted``, only those texts are cut, wherever they appear."""
    if isinstance(value, Mapping):
        return {k: previewed(v, quoted) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [previewed(v, quoted) for v in value]
    if quoted is None:
        return preview(value)
    if isinstance(value, str):
        for text in quoted:
            value = value.replace(text, preview(text))
    return value


def long_texts(*texts: object) -> tuple[str, ...]:
    """The texts past ``LONG_TEXT``, shortest first, so an answer is cut inside its reply too with the same sha256."""
    return tuple(sorted({t for t in texts if isinstance(t, str) and len(t) > LONG_TEXT}, key=len))


def _present(obj: object) -> dict[str, Any]:
    """The dataclass's fields that hold a value, in declaration order."""
    return {f.name: getattr(obj, f.name) for f in fields(obj) if getattr(obj, f.name) is not None}


def _pick(cls: type, record: Mapping[str, Any]) -> Any:
    return cls(**{f.name: record[f.name] for f in fields(cls) if f.name in record})


@dataclass(frozen=True)
class StepError:
    """A step that gave no usable value: the instance is failed for that part, never scored as 0."""

    step: str  #: the step that failed ("infer", "decompose", "match_precision", "judge", ...)
    kind: str  #: provider | timeout | rate_limit | auth | context_length | unparseable | invalid | length |
    #: content_filter (the provider refused) | ...
    message: str  #: one line for a human (secrets scrubbed before it is written)

    def to_record(self) -> dict[str, str]:
        return {"step": self.step, "kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class Truth:
    """The instance's ground truth, copied into its record so a record can be read on its own."""

    gt_preference: str  #: the current contextual preference (what a perfect inference states)
    gt_checklist: list[str]  #: its decomposition from the dataset (recall side of matching; judge rubric)
    gt_checklist_len: int  #: len(gt_checklist): the denominator of micro recall, even when the instance failed
    context_factor: str  #: the current context factor


@dataclass(frozen=True)
class HistoryView:
    """What the setting showed the model of the instance's history, and where the evidence sat."""

    n_context_sessions: int  #: prior sessions shown (8 standard, 2 oracle, k retrieval)
    relevant_positions: list[int]  #: 1-based positions of sessions sharing the current factor and preference
    n_prior_sessions: int  #: prior sessions in the instance (8 in CUPID)
    history_words: int  #: words in all prior dialogues (x axis of paper Fig. 9)


@dataclass(frozen=True)
class InferenceResult:
    """Inference task: the stated preference, its checklist and the two-way matching (paper §2.3)."""

    inferred_preference: str | None = None  #: the model's one-sentence preference
    inferred_checklist: list[str] | None = None  #: the evaluator's decomposition of it (at most max items)
    precision_labels: list[float] | None = None  #: per inferred item: covered by the true preference (1/0.5/0)
    recall_labels: list[float] | None = None  #: per true item: covered by the inferred preference (1/0.5/0)
    n_predicted: int | None = None  #: len(inferred_checklist)
    n_true: int | None = None  #: len(gt_checklist)
    predicted_matched: float | None = None  #: sum(precision_labels) (micro precision numerator)
    true_matched: float | None = None  #: sum(recall_labels) (micro recall numerator)
    precision: float | None = None  #: mean(precision_labels); None when the instance failed
    recall: float | None = None  #: mean(recall_labels)
    f1: float | None = None  #: harmonic mean of this instance's precision and recall


@dataclass(frozen=True)
class GenerationResult:
    """Generation task: the model's answer and the judge's 1-10 score, kept as written."""

    response: str | None = None  #: the model's answer to the current request
    judge_score: float | None = None  #: the judge's score; None when generation or judging failed


@dataclass(frozen=True)
class SettingOutput:
    """What a setting adds to a record (retrieval scores, summaries, data warnings); none for standard."""

    retrieved_positions: list[int] | None = None  #: retrieval: the sessions the retriever picked
    retrieval: dict[str, float | None] | None = None  #: retrieval: recall@k, precision@k, contrastive/stale hit
    summaries: list[dict[str, Any]] | None = None  #: summary: the model's per-session summaries
    data_warnings: list[str] | None = None  #: e.g. the oracle filter kept an unexpected number of sessions


@dataclass
class InstanceResult:
    """Everything known about one instance's run: one line of instances.jsonl."""

    key: str  #: persona_id/instance_type (persona_id alone repeats 3x in CUPID)
    persona_id: str  #: the persona (the bootstrap's cluster)
    instance_type: str  #: consistent | contrastive | changing
    truth: Truth
    history: HistoryView
    setting: SettingOutput = field(default_factory=SettingOutput)
    inference: InferenceResult | None = None  #: None when the job does not run inference
    generation: GenerationResult | None = None  #: None when the job does not run generation
    errors: list[StepError] = field(default_factory=list)  #: failed steps, in the order they failed
    raw: dict[str, list[str]] = field(default_factory=dict)  #: step -> every raw reply (re-asks included)
    usage: dict[str, dict[str, float]] = field(default_factory=dict)  #: step -> calls and tokens
    epoch: int | None = None  #: which run of the instance (``runtime.epochs`` > 1; from 0), None with one epoch

    @property
    def failed(self) -> bool:
        return bool(self.errors)

    def to_record(self) -> dict[str, Any]:
        """The flat instances.jsonl line (the schema scoring, reporting and resume read)."""
        record: dict[str, Any] = {"key": self.key, "persona_id": self.persona_id, "instance_type": self.instance_type}
        if self.epoch is not None:  # one epoch: the record it always was
            record["epoch"] = self.epoch
        for part in (self.truth, self.history, self.setting, self.inference, self.generation):
            if part is not None:
                record.update(_present(part))
        # the raw replies as previews past LONG_TEXT: the parsed answer above is whole (in the journal; previewed in
        # every later copy: ``previewed``)
        raw = {step: [preview(reply) for reply in replies] for step, replies in self.raw.items()}
        record.update(errors=[e.to_record() for e in self.errors], raw=raw, usage=self.usage)
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any], parts: tuple[str, ...] = ("inference", "generation")
                    ) -> "InstanceResult":
        """Read an instances.jsonl (or journal) line back; ``parts`` are the tasks the job ran."""
        return cls(
            key=record["key"], persona_id=record["persona_id"], instance_type=record["instance_type"],
            truth=_pick(Truth, record), history=_pick(HistoryView, record), setting=_pick(SettingOutput, record),
            inference=_pick(InferenceResult, record) if "inference" in parts else None,
            generation=_pick(GenerationResult, record) if "generation" in parts else None,
            errors=[StepError(e["step"], e["kind"], e.get("message", "")) for e in record.get("errors", [])],
            raw=dict(record.get("raw", {})), usage=dict(record.get("usage", {})), epoch=record.get("epoch"),
        )
