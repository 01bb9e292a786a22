"""One evaluated instance: the setting's view once, then the task parts concurrently; a bug stops the job."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

from cupid_exp.data.schema import Instance, relevant_positions
from cupid_exp.job.lanes import pool_slots, together
from cupid_exp.llm.epochs import EPOCH
from cupid_exp.llm.steps import StepFailed, Transcript
from cupid_exp.progress import Progress
from cupid_exp.results import HistoryView, InstanceResult, SettingOutput, Truth
from cupid_exp.settings.base import Setting, View
from cupid_exp.tasks import TASKS
from cupid_exp.tasks.context import TaskContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpochInstance(Instance):
    """One run of an instance when ``runtime.epochs`` > 1, keyed ``<persona>/<type>#<epoch>`` (from 0)."""

    epoch: int = 0

    @property
    def key(self) -> str:
        return f"{self.persona_id}/{self.instance_type}#{self.epoch}"


def with_epochs(instances: Sequence[Instance], epochs: int) -> list[Instance]:
    """The job's units: the instances themselves with one epoch, else each instance's epochs in turn."""
    if epochs == 1:
        return list(instances)
    return [EpochInstance(**vars(i), epoch=e) for i in instances for e in range(epochs)]


async def evaluate_instance(setting: Setting, parts: Sequence[str], ctx: TaskContext, instance: Instance,
                            progress: Progress | None = None) -> InstanceResult:
    """The setting's view, then every task part on it; failed steps are recorded, never raised."""
    epoch = instance.epoch if isinstance(instance, EpochInstance) else None
    token = EPOCH.set(epoch)  # its calls' seed and cache entry (``llm.epochs``)
    try:
        return await _evaluate(setting, parts, ctx, instance, progress, epoch)
    finally:
        EPOCH.reset(token)


async def _evaluate(setting: Setting, parts: Sequence[str], ctx: TaskContext, instance: Instance,
                    progress: Progress | None, epoch: int | None) -> InstanceResult:
    transcript = Transcript()
    try:
        view: View | None = await setting.view(instance, ctx, transcript)
    except StepFailed as exc:
        transcript.fail(exc)
        log.warning("instance %s: %s", instance.key, exc)
        view = None
    done = progress.done if progress is not None else lambda stage: None
    for stage in setting.stages:
        done(stage)
    outcomes: dict[str, object] = {}
    if view is not None:
        async def part(name: str) -> None:
            outcomes[name] = await TASKS[name](ctx, instance, view, transcript)
            done(name)

        await together(*(part(name) for name in parts))  # a bug in one part stops the others
    else:
        for name in parts:
            done(name)
    for error in transcript.errors:
        log.warning("instance %s: %s", instance.key, error.message)
    n_shown = len(view.positions) if view is not None else len(setting.positions(instance))
    words = sum(len(m.content.split()) for s in instance.prior_interactions for m in s.dialogue)
    return InstanceResult(
        key=instance.key, persona_id=instance.persona_id, instance_type=instance.instance_type,
        truth=Truth(gt_preference=instance.current_contextual_preference, gt_checklist=list(instance.current_checklist),
                    gt_checklist_len=len(instance.current_checklist), context_factor=instance.current_context_factor),
        history=HistoryView(n_context_sessions=n_shown, relevant_positions=relevant_positions(instance),
                            n_prior_sessions=len(instance.prior_interactions), history_words=words),
        setting=view.output if view is not None else SettingOutput(),
        inference=outcomes.get("inference"), generation=outcomes.get("generation"),
        errors=transcript.errors, raw=transcript.raw, usage=transcript.usage, epoch=epoch)


def instances_in_flight(ctx: TaskContext) -> int:
    """Twice the job's pool slots, so every free slot finds a call waiting while memory stays bounded."""
    return 2 * pool_slots((ctx.subject, ctx.evaluator.decomposer, ctx.evaluator.matcher, ctx.evaluator.judge))
