"""Synthesis as a kind of work for the job lifecycle (``cupid_exp.job``): the unit is a persona."""

from __future__ import annotations

import functools
import hashlib
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from cupid_exp.config import ConfigError, require
from cupid_exp.job.lanes import pool_slots
from cupid_exp.job.spec import Published, TrackingView, Work
from cupid_exp.outputs import atomic_write_text, write_json, write_jsonl
from cupid_exp.progress import Progress
from cupid_exp.prompts import PromptSet
from cupid_exp.synthesis.config import NOT_IDENTITY, ROLES, SynthesizeConfig
from cupid_exp.synthesis.personas import PersonaTemplate, builtin_seeds, personahub_seeds, sample_templates

if TYPE_CHECKING:
    from cupid_exp.job import Job
    from cupid_exp.job.spec import Execution
    from cupid_exp.llm.budget import Budget
    from cupid_exp.llm.usage import UsageMeter
    from cupid_exp.synthesis.phases import PersonaOutcome
    from cupid_exp.synthesis.steps import SynthContext
    from cupid_exp.synthesis.summary import SynthesisSummary

log = logging.getLogger(__name__)

SYNTHESIS_PROMPTS = ("persona_generator", "context_factors_generator", "preference_changer", "sessions_generator",
                     "preference_decomposer", "user_simulator", "assistant_simulator", "expression_validator")
STAGE = "personas"


def prompts_digest(prompts: PromptSet) -> str:
    h = hashlib.sha256()
    for name in SYNTHESIS_PROMPTS:
        h.update(name.encode() + b"\0" + prompts._path(f"synthesis/{name}.yaml").read_bytes())
    return h.hexdigest()[:16]


def persona_templates(cfg: SynthesizeConfig) -> list[PersonaTemplate]:
    scfg = cfg.synthesis
    if scfg.persona_source == "personahub":
        p = scfg.personahub
        seeds = personahub_seeds(scfg.n_personas, scfg.seed, p.name, p.subset, p.split, p.text_field)
    else:
        seeds = builtin_seeds(scfg.n_personas, scfg.seed)
    return sample_templates(scfg.n_personas, scfg.seed, seeds)


def check_synthesis(cfg: SynthesizeConfig) -> None:
    """Refused before any call: dry runs and the Batch API (each step needs the last's output) and epochs."""
    require(not cfg.calls.dry_run, "calls.dry_run", cfg.calls.dry_run,
            "false: synthesis needs each step's real output to write the next")
    require(not cfg.calls.batch, "calls.batch", cfg.calls.batch,
            "false: each persona is a chain of dependent calls, each of which would wait for a batch of its own")
    require(cfg.runtime.epochs == 1, "runtime.epochs", cfg.runtime.epochs,
            "1: epochs repeat an evaluation's instances; synthesis draws each persona once")
    for role in ROLES:
        model = getattr(cfg.synthesis.roles, role)
        require(not model.batch, f"synthesis.roles.{role}.batch", model.batch,
                "false or null: synthesis sends its calls one by one (a persona's calls depend on each other)")


@dataclass(frozen=True)
class SynthesisWork:
    """Synthesis's verbs, with its prompts and output folder."""

    cfg: SynthesizeConfig
    prompts: PromptSet
    output_dir: Path

    @property
    def journeys(self) -> Path:
        return self.output_dir / "journeys"

    @property
    def instances_path(self) -> Path:
        return self.output_dir / "instances" / "instances.jsonl"

    def connect(self, meter: "UsageMeter", budget: "Budget | None", share: tuple[int, int]
                ) -> tuple["SynthContext", int]:
        """The role clients (roles on one model config share one) and the recipe's knobs every step reads."""
        from cupid_exp.llm._litellm import import_first_call_modules
        from cupid_exp.llm.client import clients_for, configure_litellm
        from cupid_exp.synthesis.steps import SynthContext

        cfg, scfg = self.cfg, self.cfg.synthesis
        configure_litellm(cfg.calls)  # the slice the clients read
        import_first_call_modules()
        clients = clients_for(cfg.roles(), cfg.calls, meter, budget, share)  # by config path; the steps name the role
        ctx = SynthContext(clients={path.rsplit(".", 1)[1]: c for path, c in clients.items()},
                           prompts=self.prompts, max_retries=scfg.max_retries, max_turns=scfg.max_turns,
                           max_checklist_items=scfg.max_checklist_items, with_resources=scfg.with_resources,
                           embedded_sampling=dict(scfg.embedded_sampling))
        return ctx, in_flight(ctx)

    async def run(self, ctx: "SynthContext", unit: PersonaTemplate, progress: Progress | None) -> "PersonaOutcome":
        """One persona, resumed from its journey file (a finished one is returned as it is)."""
        from cupid_exp.synthesis.journey import make_template
        from cupid_exp.synthesis.phases import synthesize_persona
        from cupid_exp.synthesis.store import JourneyStore

        scfg = self.cfg.synthesis
        store = JourneyStore.open(self.journeys, unit, make_template(scfg.seed, unit.index), scfg.seed)
        outcome = await synthesize_persona(ctx, scfg, unit, store)
        if progress is not None:
            progress.done(STAGE)
        return outcome

    def summarise(self, job: "Job", execution: "Execution") -> "SynthesisSummary":
        """Every persona that ran, in order: this attempt's and the journal's finished ones."""
        from cupid_exp.synthesis.phases import PersonaOutcome
        from cupid_exp.synthesis.store import JourneyStore
        from cupid_exp.synthesis.summary import Completeness, SynthesisSummary, summary_metrics

        fresh = {o.key: o for o in execution.results}
        outcomes = []
        for template in job.work.units:
            outcome = fresh.get(template.key)
            if outcome is None and template.key in job.attempt.done:
                store = JourneyStore.read(self.journeys, template.key)
                outcome = PersonaOutcome.from_store(template.index, store) if store is not None else None
            if outcome is not None:
                outcomes.append(outcome)
        max_failed = self.cfg.runtime.max_failed_fraction
        metrics = summary_metrics(outcomes, job.attempt.meter, max_failed)
        metrics.update({"resume/personas_from_journal": float(len(job.attempt.done)),
                        "time/model_seconds": execution.seconds, "time/model_cpu_seconds": execution.cpu_seconds})
        return SynthesisSummary(outcomes, metrics, Completeness.of(outcomes, max_failed), self.instances_path)

    def publish(self, job: "Job", summary: "SynthesisSummary", complete: bool) -> Published:
        """personas.json, instances.jsonl, validation.json/.csv and metrics.json."""
        from cupid_exp.synthesis.summary import render_report, validation_table

        out, outcomes, metrics = self.output_dir, summary.outcomes, summary.metrics
        by_index = {t.index: t for t in job.work.units}
        personas = []
        for o in outcomes:
            p = o.journey.get("persona") or {}
            personas.append({"persona_id": p.get("persona_id"), **asdict(by_index[o.index]),
                             "description": p.get("description"), "occupation": p.get("occupation"),
                             "status": o.journey.get("status"), "failed_phase": o.failed_phase, "error": o.error})
        write_json(out / "personas.json", personas)
        write_jsonl(self.instances_path, summary.instances)
        write_json(out / "validation.json", {
            "summary": {k: v for k, v in metrics.items() if k.startswith("validation/")},
            "instances": [v for o in outcomes for v in o.validation]})
        table = validation_table(outcomes)
        atomic_write_text(out / "validation.csv", table.to_csv(index=False))
        write_json(out / "metrics.json", {
            "metrics": metrics, "usage": job.attempt.meter.as_dict(), "complete": complete,
            "personas": [{"index": o.index, "status": o.journey.get("status"), "failed_phase": o.failed_phase,
                          "error": o.error, "dropped_instances": o.dropped} for o in outcomes],
            "prompts_digest": job.work.digests["prompts_digest"]})
        files = [out / "personas.json", self.instances_path, out / "validation.json", out / "validation.csv",
                 out / "metrics.json"]
        report = functools.partial(render_report, self.cfg.synthesis, metrics, outcomes, self.instances_path)
        return Published(files=files, tags={"cupid.failed_personas": str(summary.completeness.failed)},
                         report=report, table=table.to_dict(orient="records"))


def in_flight(ctx: "SynthContext") -> int:
    """Twice the roles' pool slots, so a second persona keeps a slot busy while one waits (an embedded model: one)."""
    total = pool_slots(ctx.clients.values())
    return 1 if total <= 1 else 2 * total


def is_final(journeys: Path, record: Mapping[str, Any], retry_failed: bool) -> bool:
    """A finished persona stands while its journey file says so; a failed one runs again from where it got."""
    from cupid_exp.synthesis.store import JourneyStore

    store = JourneyStore.read(journeys, record["key"]) if record.get("status") == "done" else None
    return store is not None and store.data.get("status") == "done"


def load_synthesis(cfg: SynthesizeConfig, output_dir: Path) -> Work:
    """The prompts synthesis sends, then the persona templates (a Hub seed source may raise ``SynthesisError``)."""
    from cupid_exp.job.checks import prompt_set
    from cupid_exp.synthesis.store import json_object

    check_synthesis(cfg)
    prompts = prompt_set(cfg.prompts.dir)
    missing = prompts.missing(f"synthesis/{name}" for name in SYNTHESIS_PROMPTS)
    if missing:  # a drop-in is taken whole: nothing falls back to the project's prompts
        raise ConfigError(f"prompts.dir={str(prompts.directory)!r} lacks {', '.join(missing)}, which synthesis "
                          "sends; add the file to that folder (the project's own is under prompts/) or leave "
                          "prompts.dir unset")
    templates = persona_templates(cfg)
    digest = prompts_digest(prompts)
    output_dir.mkdir(parents=True, exist_ok=True)
    state = output_dir / "state.json"
    before = json_object(state, "synthesis state", "the prompts it was started with are not known: finished "
                         "artefacts are kept")
    if before is not None and before.get("prompts_digest") != digest:
        log.warning("the synthesis prompts changed since %s was started; finished artefacts are kept", output_dir)
    write_json(state, {"prompts_digest": digest})
    log.info("synthesising %d personas into %s", len(templates), output_dir)
    kind = SynthesisWork(cfg, prompts, output_dir)
    scfg = cfg.synthesis
    writer = scfg.roles.session_writer.name
    return Work(
        kind=kind, noun="persona", units=tuple(templates), roles=cfg.roles(), digests={"prompts_digest": digest},
        title=f"CUPID synthesis | recipe={scfg.name} seed={scfg.seed} session_writer={writer}",
        not_identity=NOT_IDENTITY,  # a larger n_personas tops the same job up
        stages=(STAGE,),
        tracking=TrackingView(
            run_name=cfg.tracking.run_name or f"synthesis-{scfg.name}-{writer}",
            tags={"cupid.task": "synthesis", "prompts_digest": digest,
                  "instances_path": str(kind.instances_path.resolve())},
            trace_tags={"cupid.task": "synthesis", "cupid.recipe": scfg.name, "cupid.seed": str(scfg.seed),
                        "cupid.session_writer": writer}),
        record_fields={"key": str, "index": int, "status": str, "errors": list},
        final=functools.partial(is_final, kind.journeys),
        units_per_process=5,  # ~120 calls a persona: 5 make about as many calls as 150 evaluated instances
        client_modules=("cupid_exp.synthesis.steps", "cupid_exp.synthesis.phases"), summary_modules=("pandas",))
