"""Evaluation as a kind of work for the job lifecycle (``cupid_exp.job``): the unit is a CUPID instance.

``load`` checks what an evaluation job sends (its prompt files, the matcher's examples, a model server) and loads
its setting and data (every row validated); each instance runs the setting's view and the task parts
(``evaluation.instances``); the summary is the paper's numbers (``scoring.summary``), the files are
``instances.jsonl`` and ``metrics.json``, the MLflow run gets the dataset input, running scores and the plots.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cupid_exp import console
from cupid_exp.config import ModelConfig, RunConfig, ServerConfig
from cupid_exp.data.loading import LoadedData, load_instances
from cupid_exp.data.schema import Instance
from cupid_exp.durability import journal
from cupid_exp.evaluation.checks import check_evaluation
from cupid_exp.evaluation.instances import evaluate_instance, instances_in_flight, with_epochs
from cupid_exp.job.spec import Digests, Published, TrackingView
from cupid_exp.job.worker_count import INSTANCES_PER_PROCESS
from cupid_exp.outputs import write_json, write_jsonl
from cupid_exp.progress import Progress
from cupid_exp.prompts import EVALUATION_PROMPTS, PromptSet
from cupid_exp.results import InstanceResult, previewed
from cupid_exp.scoring.summary import JobSummary, epoch_metrics, summarize
from cupid_exp.secrets import scrub_obj
from cupid_exp.settings import make_setting
from cupid_exp.settings.base import Setting
from cupid_exp.tasks import check_task_parts
from cupid_exp.tasks.context import TaskContext
from cupid_exp.tracking.provenance import git_state

if TYPE_CHECKING:
    from cupid_exp.job import Job
    from cupid_exp.job.spec import Execution
    from cupid_exp.llm.budget import Budget
    from cupid_exp.llm.usage import UsageMeter
    from cupid_exp.tracking.live import PlotRequest

log = logging.getLogger(__name__)


@dataclass
class EvaluationWork:
    """One evaluation job's instances, with the setting, prompts and task parts they run under."""

    cfg: RunConfig
    data: LoadedData
    prompts: PromptSet
    setting: Setting
    parts: tuple[str, ...]  #: the task parts to run, in order

    noun = "instance"
    not_identity = ("data.path",)  #: the data enter by their digest, not by how a file's path is spelt
    units_per_process = INSTANCES_PER_PROCESS
    client_modules = ("cupid_exp.evaluators", "cupid_exp.rendering", "cupid_exp.settings")
    summary_modules = ("cupid_exp.scoring.bootstrap",)  # pandas, numpy (~0.3 s of CPU)
    whole_record = staticmethod(journal.whole_record)  #: the journal's own record checks
    is_final = staticmethod(journal.is_final)
    in_flight = staticmethod(instances_in_flight)

    @classmethod
    def load(cls, cfg: RunConfig, output_dir: Path) -> "EvaluationWork":
        """The task parts (against the registry) and the setting's, the prompts the job sends, then the data (every
        row validated)."""
        from cupid_exp.job.checks import prompt_set

        check_task_parts(cfg.task.parts)
        setting = make_setting(cfg.setting)
        setting.check_parts(cfg.task.parts)
        prompts = prompt_set(cfg.prompts.dir)
        check_evaluation(cfg, setting, prompts)
        data = load_instances(cfg.data)
        log.info("%d instances from %s (%d bad rows); model=%s evaluator=%s", len(data.instances), data.source,
                 len(data.errors), cfg.model.name, cfg.evaluator.name)
        return cls(cfg, data, prompts, setting, tuple(cfg.task.parts))

    @functools.cached_property
    def units(self) -> list[Instance]:
        """The instances, each ``runtime.epochs`` times (an epoch a unit of its own: ``with_epochs``)."""
        return with_epochs(self.data.instances, self.cfg.runtime.epochs)

    def roles_called(self) -> dict[str, ModelConfig]:
        """The roles of ``cfg.roles()`` this job's parts call (the subject's always)."""
        unused = {"inference": ("evaluator.decomposer", "evaluator.matcher"), "generation": ("evaluator.judge",)}
        return {role: model for role, model in self.cfg.roles().items()
                if not any(role in roles for part, roles in unused.items() if part not in self.parts)}

    def digests(self) -> Digests:
        return {"dataset_digest": self.data.digest, "prompts_digest": self.prompts_digest}

    @property
    def prompts_digest(self) -> str:
        return self.prompts.digest(EVALUATION_PROMPTS)

    def portable(self) -> "EvaluationWork":
        return dataclasses.replace(self, data=LoadedData(instances=[]))

    def connect(self, meter: "UsageMeter", budget: "Budget | None", share: tuple[int, int]) -> TaskContext:
        """Clients for every role (one per distinct model config) and the evaluator around them."""
        from cupid_exp.evaluators import Evaluator
        from cupid_exp.llm.client import clients_for, configure_litellm
        from cupid_exp.llm.steps import Reask
        from cupid_exp.rendering import matcher_examples

        cfg = self.cfg
        calls = cfg.runtime.call_settings()  # what the clients read of runtime
        configure_litellm(calls)
        if not cfg.runtime.dry_run:
            from cupid_exp.llm._litellm import import_first_call_modules

            import_first_call_modules()
        ev = cfg.evaluator
        clients = clients_for(cfg.roles(), calls, meter, budget, share)  # by config path: a fatal refusal names it
        retry = Reask(cfg.runtime.reask)
        examples = matcher_examples(self.prompts.matcher_examples()) if ev.matcher_few_shot else None
        evaluator = Evaluator(*(clients[f"evaluator.{role}"] for role in ("decomposer", "matcher", "judge")),
                              self.prompts, matcher_prompt=ev.matcher_prompt, matcher_examples=examples,
                              max_checklist_items=ev.max_checklist_items, retry=retry)
        return TaskContext(clients["model"], evaluator, self.prompts, retry)

    def stages(self) -> list[str]:
        return [*self.setting.stages, *self.parts]

    async def run(self, ctx: TaskContext, unit: Instance, progress: Progress | None) -> InstanceResult:
        return await evaluate_instance(self.setting, self.parts, ctx, unit, progress)

    def model_server(self) -> ServerConfig | None:
        """The evaluator's model server the job starts (PrefMatcher), if any."""
        return self.cfg.evaluator.server

    def summarise(self, job: "Job", execution: "Execution") -> JobSummary:
        """The job's summary from the journal's finished records and this run's fresh ones, in dataset order."""
        fresh = {r.key: r.to_record() for r in execution.results}
        done = job.attempt.done
        # an instance a budget left unrun has no record (it is run on resume)
        records = [r for i in self.units if (r := done.get(i.key) or fresh.get(i.key)) is not None]
        extra = self.setting.metrics(records)
        extra.update(epoch_metrics(records, self.parts, self.cfg.runtime.failure_policy))
        extra.update({"resume/instances_from_journal": float(len(done)), "data/bad_rows": float(len(self.data.errors)),
                      "data/oracle_count_warnings": float(sum(1 for r in records if r.get("data_warnings"))),
                      "time/model_seconds": execution.seconds, "time/model_cpu_seconds": execution.cpu_seconds})
        cfg = self.cfg
        return summarize(records, self.parts, failure_policy=cfg.runtime.failure_policy, meter=job.attempt.meter,
                         extra_metrics=extra, seed=cfg.seed, with_intervals=not job.dry_run,
                         max_failed_fraction=cfg.runtime.max_failed_fraction)

    def title(self, job: "Job") -> str:
        cfg = self.cfg
        return console.header(cfg.task.name, {"model": cfg.model.name, "setting": self.setting.label(),
                                              "evaluator": cfg.evaluator.name, "data": cfg.data.name})

    def tracking(self, job: "Job") -> TrackingView:
        from cupid_exp.tracking.dataset import dataset_input

        cfg, ev = self.cfg, self.cfg.evaluator
        return TrackingView(
            run_name=cfg.tracking.run_name or self.run_name(),
            tags={"dataset_digest": self.data.digest, "dataset_source": self.data.source,
                  "prompts_digest": self.prompts_digest},
            dataset=dataset_input(cfg.data, self.data), parts=self.parts, policy=cfg.runtime.failure_policy,
            trace_tags={"cupid.model": cfg.model.name, "cupid.setting": self.setting.label(),
                        "cupid.task": cfg.task.name, "cupid.evaluator": ev.name, "cupid.data": cfg.data.name},
            judges={"inference": ev.matcher.name, "generation": ev.judge.name},  # whose labels the scores are
            plots=self._plots(job),
            shown={i.key: (i.current_request, i.current_context_factor) for i in self.units
                   if i.key in job.attempt.done})

    def run_name(self) -> str:
        """What tells this job's run apart in MLflow's runs list (``tracking.names.job_run_name``)."""
        from cupid_exp.tracking.dataset import dataset_name
        from cupid_exp.tracking.names import hydra_overrides, job_run_name

        cfg = self.cfg  # the data as the Dataset column names it: the file (or Hub id) and the subset taken
        return job_run_name(cfg.model.name, cfg.task.name, self.setting.label(), cfg.evaluator.name,
                            dataset_name(cfg.data, self.data), "", hydra_overrides(),
                            cfg.runtime.epochs)

    def _plots(self, job: "Job") -> PlotRequest:
        """Score by type, score vs relevant-session position (paper Fig. 3), vs history length (Fig. 9)."""
        from cupid_exp.tracking.live import PlotRequest

        cfg = self.cfg
        return PlotRequest(parts=self.parts, folder=str(job.output_dir / "plots"), seed=cfg.seed,
                           failure_policy=cfg.runtime.failure_policy,
                           title_prefix=f"{cfg.model.name} {self.setting.label()}",
                           order=tuple(i.key for i in self.units))

    def publish(self, job: "Job", summary: JobSummary, complete: bool) -> Published:
        """instances.jsonl and metrics.json (atomically: a tracking failure can never cost the results); a dry
        run's replies are placeholders: it writes no record and no score. A long answer is its preview here and in
        the run's table: whole once, in the journal."""
        out = job.output_dir
        records = previewed(scrub_obj(summary.records, list(job.spec.secrets)))
        out.mkdir(parents=True, exist_ok=True)
        if not job.dry_run:
            write_jsonl(out / "instances.jsonl", records)
        metrics = console.dry_run_metrics(summary.metrics) if job.dry_run else summary.metrics
        write_json(out / "metrics.json", {
            "dry_run": job.dry_run, "git": git_state(), "metrics": metrics,
            "breakdown": {} if job.dry_run else summary.nested,
            "errors": summary.errors, "usage": job.attempt.meter.as_dict(), "complete": complete,
            "failed_instances": summary.failed_instances, "failure_reasons": summary.failure_reasons(),
            "data": {"source": self.data.source, "digest": self.data.digest, "instances": len(self.data.instances),
                     "bad_rows": [str(e) for e in self.data.errors]},
            "prompts_digest": self.prompts_digest})
        return Published(files=[out / "instances.jsonl", out / "metrics.json"],
                         tags={"cupid.failed_instances": str(summary.failed_instances)}, table=records,
                         plots=self._plots(job), replies=[out / "instances.jsonl"])

    def report(self, job: "Job", summary: JobSummary, where: str, status: str) -> str:
        return console.job_report(self.title(job), summary.nested, summary.errors, summary.metrics,
                                  len(self.data.errors), where, status)
