"""Evaluation as a kind of work for the job lifecycle (``cupid_exp.job``): the unit is a CUPID instance."""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from cupid_exp.config import RunConfig
from cupid_exp.data.loading import LoadedData, load_instances
from cupid_exp.data.schema import Instance
from cupid_exp.durability import journal
from cupid_exp.evaluation.instances import evaluate_instance, instances_in_flight, with_epochs
from cupid_exp.job.checks import check_prompts, prompt_set
from cupid_exp.job.publish import dry_run_metrics, header, job_report
from cupid_exp.job.spec import Digests, Published, TrackingView, Work
from cupid_exp.job.worker_count import INSTANCES_PER_PROCESS
from cupid_exp.llm.server import check_server_command
from cupid_exp.outputs import write_json, write_jsonl
from cupid_exp.progress import Progress
from cupid_exp.prompts import EVALUATION_PROMPTS, PromptSet
from cupid_exp.resources import git_state
from cupid_exp.results import InstanceResult, previewed
from cupid_exp.scoring.summary import JobSummary, epoch_metrics, summarize
from cupid_exp.secrets import scrub_obj
from cupid_exp.settings import make_setting
from cupid_exp.settings.base import Setting
from cupid_exp.tasks import check_task_parts
from cupid_exp.tasks.context import TaskContext

if TYPE_CHECKING:
    from cupid_exp.job import Job
    from cupid_exp.job.spec import Execution
    from cupid_exp.llm.budget import Budget
    from cupid_exp.llm.usage import UsageMeter

log = logging.getLogger(__name__)

# The placeholders each step fills, by prompt file (a drop-in prompt may use fewer, never others).
STEP_PROMPTS = {
    "inference": {"evaluation/preference_inferrer": {"interaction_log", "curr_request"},
                  "synthesis/preference_decomposer": {"preferences"}},
    "generation": {"evaluation/response_judger": {"preference", "checklist", "user_request", "ai_response"}},
}
MATCHER_FIELDS = {"checklist", "preference", "examples"}
GENERATOR_FIELDS = {"interaction_log", "curr_request"}


@dataclass(frozen=True)
class EvaluationWork:
    """Evaluation's verbs, with what its instances run under (the instances are its ``Work``'s units)."""

    cfg: RunConfig
    data: LoadedData  #: the data's digest, source and bad rows, without the instances
    prompts: PromptSet
    setting: Setting
    parts: tuple[str, ...]  #: the task parts to run, in order

    def connect(self, meter: "UsageMeter", budget: "Budget | None", share: tuple[int, int]) -> tuple[TaskContext, int]:
        """Clients for every role (one per distinct model config) and the evaluator around them."""
        from cupid_exp.evaluators import Evaluator
        from cupid_exp.llm.client import clients_for, configure_litellm
        from cupid_exp.llm.steps import Reask
        from cupid_exp.rendering import matcher_examples

        cfg = self.cfg
        configure_litellm(cfg.calls)  # the slice the clients read
        if not cfg.calls.dry_run:
            from cupid_exp.llm._litellm import import_first_call_modules

            import_first_call_modules()
        ev = cfg.evaluator
        clients = clients_for(cfg.roles(), cfg.calls, meter, budget, share)  # by config path: a fatal refusal names it
        retry = Reask(cfg.runtime.reask)
        examples = matcher_examples(self.prompts.matcher_examples()) if ev.matcher_few_shot else None
        evaluator = Evaluator(*(clients[f"evaluator.{role}"] for role in ("decomposer", "matcher", "judge")),
                              self.prompts, matcher_prompt=ev.matcher_prompt, matcher_examples=examples,
                              max_checklist_items=ev.max_checklist_items, retry=retry)
        ctx = TaskContext(clients["model"], evaluator, self.prompts, retry)
        return ctx, instances_in_flight(ctx)

    async def run(self, ctx: TaskContext, unit: Instance, progress: Progress | None) -> InstanceResult:
        return await evaluate_instance(self.setting, self.parts, ctx, unit, progress)

    def summarise(self, job: "Job", execution: "Execution") -> JobSummary:
        """The job's summary from the journal's finished records and this run's fresh ones, in dataset order."""
        fresh = {r.key: r.to_record() for r in execution.results}
        done = job.attempt.done
        # an instance a budget left unrun has no record (it is run on resume)
        records = [r for i in job.work.units if (r := done.get(i.key) or fresh.get(i.key)) is not None]
        extra = self.setting.metrics(records)
        extra.update(epoch_metrics(records, self.parts, self.cfg.runtime.failure_policy))
        extra.update({"resume/instances_from_journal": float(len(done)), "data/bad_rows": float(len(self.data.errors)),
                      "data/oracle_count_warnings": float(sum(1 for r in records if r.get("data_warnings"))),
                      "time/model_seconds": execution.seconds, "time/model_cpu_seconds": execution.cpu_seconds})
        cfg = self.cfg
        return summarize(records, self.parts, failure_policy=cfg.runtime.failure_policy, meter=job.attempt.meter,
                         extra_metrics=extra, seed=cfg.seed, with_intervals=not job.dry_run,
                         max_failed_fraction=cfg.runtime.max_failed_fraction)

    def publish(self, job: "Job", summary: JobSummary, complete: bool) -> Published:
        """instances.jsonl and metrics.json, written atomically; a dry run writes no record and no score."""
        out, data = job.output_dir, self.data
        records = previewed(scrub_obj(summary.records, list(job.spec.secrets)))
        out.mkdir(parents=True, exist_ok=True)
        if not job.dry_run:
            write_jsonl(out / "instances.jsonl", records)
        metrics = dry_run_metrics(summary.metrics) if job.dry_run else summary.metrics
        write_json(out / "metrics.json", {
            "dry_run": job.dry_run, "git": git_state(), "metrics": metrics,
            "breakdown": {} if job.dry_run else summary.nested,
            "errors": summary.errors, "usage": job.attempt.meter.as_dict(), "complete": complete,
            "failed_instances": summary.failed_instances, "failure_reasons": summary.failure_reasons(),
            "data": {"source": data.source, "digest": data.digest,
                     "instances": len(job.work.units) // self.cfg.runtime.epochs,
                     "bad_rows": [str(e) for e in data.errors]},
            "prompts_digest": job.work.digests["prompts_digest"]})
        report = functools.partial(job_report, job.work.title, summary.nested, summary.errors,
                                   summary.metrics, len(data.errors))
        return Published(files=[out / "instances.jsonl", out / "metrics.json"],
                         tags={"cupid.failed_instances": str(summary.failed_instances)}, report=report, table=records,
                         replies=[out / "instances.jsonl"])


def prompts_needed(cfg: RunConfig, setting: Setting, parts: Iterable[str]) -> dict[str, set[str]]:
    """Every prompt file the job will send, with the placeholders the sending step fills."""
    needed = dict(setting.own_prompts())
    for part in parts:
        needed.update(STEP_PROMPTS[part])
    if "inference" in parts:
        needed[cfg.evaluator.matcher_prompt] = MATCHER_FIELDS
    if "generation" in parts:
        needed[setting.generation_prompt] = GENERATOR_FIELDS | setting.generation_fields
    return needed


def load_evaluation(cfg: RunConfig, output_dir: Path) -> Work:
    """The task parts, the setting, the prompts (each checked) and the data (every row validated); units repeat per
    epoch."""
    check_task_parts(cfg.task.parts)
    setting = make_setting(cfg.setting)
    setting.check_parts(cfg.task.parts)
    prompts = prompt_set(cfg.prompts.dir)
    check_prompts(prompts, prompts_needed(cfg, setting, cfg.task.parts))
    if cfg.evaluator.matcher_few_shot:  # read with the clients (``connect``): a drop-in's own examples or the
        prompts.matcher_examples()  # official module's, never ours; ConfigError in one line
    if not cfg.calls.dry_run:  # a dry run starts no server
        check_server_command(cfg.evaluator.server)
    data = load_instances(cfg.data)
    log.info("%d instances from %s (%d bad rows); model=%s evaluator=%s", len(data.instances), data.source,
             len(data.errors), cfg.model.name, cfg.evaluator.name)
    parts = tuple(cfg.task.parts)
    units = tuple(with_epochs(data.instances, cfg.runtime.epochs))
    digests: Digests = {"dataset_digest": data.digest, "prompts_digest": prompts.digest(EVALUATION_PROMPTS)}
    unused = {"inference": ("evaluator.decomposer", "evaluator.matcher"), "generation": ("evaluator.judge",)}
    roles = {role: model for role, model in cfg.roles().items()  # the subject's always
             if not any(role in names for part, names in unused.items() if part not in parts)}
    ev = cfg.evaluator
    return Work(
        kind=EvaluationWork(cfg, dataclasses.replace(data, instances=[]), prompts, setting, parts),
        noun="instance", units=units, roles=roles, digests=digests,
        title=header(cfg.task.name, {"model": cfg.model.name, "setting": setting.label(),
                                             "evaluator": ev.name, "data": cfg.data.name}),
        not_identity=("data.path",),  # the data enter by their digest, not by how a file's path is spelt
        stages=(*setting.stages, *parts), tracking=_tracking(cfg, data, setting, units, digests, output_dir),
        record_fields=journal.RECORD_FIELDS, final=journal.is_final, units_per_process=INSTANCES_PER_PROCESS,
        client_modules=("cupid_exp.evaluators", "cupid_exp.rendering", "cupid_exp.settings"),
        summary_modules=("cupid_exp.scoring.bootstrap",),  # pandas, numpy (~0.3 s of CPU)
        model_server=ev.server)  # the evaluator's (PrefMatcher), if any


def _tracking(cfg: RunConfig, data: LoadedData, setting: Setting, units: tuple[Instance, ...], digests: Digests,
              output_dir: Path) -> TrackingView:
    """The run's name, dataset input, running scores and plots (by type, by relevant position, by history length)."""
    from cupid_exp.tracking.live import PlotRequest, dataset_input, dataset_name
    from cupid_exp.tracking.mlflow import hydra_overrides, job_run_name

    ev, parts, label = cfg.evaluator, tuple(cfg.task.parts), setting.label()
    return TrackingView(
        run_name=cfg.tracking.run_name or job_run_name(
            cfg.model.name, cfg.task.name, label, ev.name, dataset_name(cfg.data, data), "", hydra_overrides(),
            cfg.runtime.epochs),
        tags={"dataset_digest": data.digest, "dataset_source": data.source,
              "prompts_digest": digests["prompts_digest"]},
        dataset=dataset_input(cfg.data, data), parts=parts, policy=cfg.runtime.failure_policy,
        trace_tags={"cupid.model": cfg.model.name, "cupid.setting": label, "cupid.task": cfg.task.name,
                    "cupid.evaluator": ev.name, "cupid.data": cfg.data.name},
        judges={"inference": ev.matcher.name, "generation": ev.judge.name},  # whose labels the scores are
        plots=PlotRequest(parts=parts, folder=str(output_dir / "plots"), seed=cfg.seed,
                          failure_policy=cfg.runtime.failure_policy, title_prefix=f"{cfg.model.name} {label}",
                          order=tuple(i.key for i in units)),
        shown={i.key: (i.current_request, i.current_context_factor) for i in units})
