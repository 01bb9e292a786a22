"""One synthesis job: check the config, open its MLflow run, run every persona, write and log the outputs.

Each persona's artefacts live in ``journeys/persona_NNN.json`` in the job dir (``store.py``); a killed
job re-run with the same command resumes there, and every model call goes through the shared client,
whose disk cache serves any call that finished. ``run_synthesis`` returns the job's ``Outcome``:
``ok`` with the number of instances, or ``incomplete`` (exit 3) when more than
``runtime.max_failed_fraction`` of the personas failed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from cupid_exp.config import ConfigError, check_known_keys, check_tree, require
from cupid_exp.entry import Outcome
from cupid_exp.llm.client import clients_for, configure_litellm, drain_background_tasks
from cupid_exp.llm.keys import missing_keys_line
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.outputs import atomic_write_text, write_json, write_jsonl
from cupid_exp.prompts import PromptSet
from cupid_exp.secrets import install_log_scrubber, redact, secret_values
from cupid_exp.synthesis import steps
from cupid_exp.synthesis.config import ROLES, SynthesisConfig, SynthesizeConfig
from cupid_exp.synthesis.journey import make_template
from cupid_exp.synthesis.personas import PersonaTemplate, builtin_seeds, personahub_seeds, sample_templates
from cupid_exp.synthesis.phases import PersonaOutcome, synthesize_persona
from cupid_exp.synthesis.report import render_report
from cupid_exp.synthesis.store import JourneyStore
from cupid_exp.synthesis.summary import Completeness, summary_metrics, validation_table
from cupid_exp.tracking.mlflow import RunTracker, SweepParent, ends_on_error, flatten, parent_of

log = logging.getLogger(__name__)

SYNTHESIS_PROMPTS = ("persona_generator", "context_factors_generator", "preference_changer", "sessions_generator",
                     "preference_decomposer", "user_simulator", "assistant_simulator", "expression_validator")


@dataclass
class SynthesisJob:
    """A job ready to run: its checked config, where it writes, and what it logs."""

    cfg: SynthesizeConfig
    resolved: dict[str, Any]  #: the resolved config as plain data, secrets redacted (MLflow params, config.yaml)
    secrets: list[str]
    output_dir: Path
    prompts: PromptSet
    digest: str  #: of the synthesis prompts in effect
    templates: list[PersonaTemplate]

    @property
    def scfg(self) -> SynthesisConfig:
        return self.cfg.synthesis

    @property
    def instances_path(self) -> Path:
        return self.output_dir / "instances" / "instances.jsonl"


def prompts_digest(prompts: PromptSet) -> str:
    h = hashlib.sha256()
    for name in SYNTHESIS_PROMPTS:
        h.update(name.encode() + b"\0" + prompts._path(f"synthesis/{name}.yaml").read_bytes())
    return h.hexdigest()[:16]


def persona_templates(scfg: SynthesisConfig) -> list[PersonaTemplate]:
    if scfg.persona_source == "personahub":
        p = scfg.personahub
        seeds = personahub_seeds(scfg.n_personas, scfg.seed, p.name, p.subset, p.split, p.text_field)
    else:
        seeds = builtin_seeds(scfg.n_personas, scfg.seed)
    return sample_templates(scfg.n_personas, scfg.seed, seeds)


def plan(cfg: DictConfig, output_dir: Path) -> SynthesisJob:
    """Everything checked before the first call: every config value (ConfigError), the seed source
    (SynthesisError), and the prompts against those the job dir was started with."""
    job_cfg: SynthesizeConfig = OmegaConf.to_object(cfg)
    check_known_keys(cfg, job_cfg)
    check_tree(job_cfg)
    require(not job_cfg.runtime.dry_run, "runtime.dry_run", job_cfg.runtime.dry_run,
            "false: synthesis needs each step's real output to write the next")
    missing_keys = missing_keys_line({f"synthesis.roles.{r}": getattr(job_cfg.synthesis.roles, r) for r in ROLES})
    if missing_keys:  # before the first call: one line, not every persona failing on auth
        raise ConfigError(missing_keys)
    resolved = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "hydra"}
    secrets = secret_values(resolved)
    install_log_scrubber(secrets)
    prompts = PromptSet(job_cfg.prompts.dir)
    missing = prompts.missing(f"synthesis/{name}" for name in SYNTHESIS_PROMPTS)
    if missing:  # a drop-in is taken whole: nothing falls back to the project's prompts
        raise ConfigError(f"prompts.dir={str(prompts.directory)!r} lacks {', '.join(missing)}, which synthesis sends; "
                          "add the file to that folder (the project's own is under prompts/) or leave prompts.dir "
                          "unset")
    templates = persona_templates(job_cfg.synthesis)
    digest = prompts_digest(prompts)
    output_dir.mkdir(parents=True, exist_ok=True)
    state_path = output_dir / "state.json"
    if state_path.exists() and json.loads(state_path.read_text()).get("prompts_digest") != digest:
        log.warning("the synthesis prompts changed since %s was started; finished artefacts are kept", output_dir)
    write_json(state_path, {"prompts_digest": digest})
    return SynthesisJob(job_cfg, redact(resolved), secrets, output_dir, prompts, digest, templates)


def start_tracking(job: SynthesisJob, choices: Mapping[str, str],
                   parent_run: str | SweepParent | None) -> RunTracker | None:
    """Open the job's MLflow run with its params and tags before any model is called."""
    cfg = job.cfg
    if not cfg.tracking.enabled:
        return None
    tracker = RunTracker(cfg.tracking, job.secrets)
    params = flatten(job.resolved)
    params.update({f"choice.{k}": str(v) for k, v in choices.items()})
    tracker.start(run_name=cfg.tracking.run_name or f"synthesis-{job.scfg.name}-{job.scfg.roles.session_writer.name}",
                  params=params, parent=parent_of(cfg.tracking, parent_run), config=job.resolved,
                  tags={"cupid.task": "synthesis", "prompts_digest": job.digest,
                        "output_dir": str(job.output_dir.resolve()), "instances_path": str(job.instances_path.resolve())})
    return tracker


def synth_context(job: SynthesisJob, meter: UsageMeter) -> steps.SynthContext:
    """The role clients and recipe knobs every step reads (litellm configured for the job's runtime)."""
    scfg = job.scfg
    calls = job.cfg.runtime.call_settings()
    configure_litellm(calls)
    return steps.SynthContext(clients=clients_for({r: getattr(scfg.roles, r) for r in ROLES}, calls, meter),
                              prompts=job.prompts, max_retries=scfg.max_retries, max_turns=scfg.max_turns,
                              max_checklist_items=scfg.max_checklist_items, with_resources=scfg.with_resources,
                              embedded_sampling=dict(scfg.embedded_sampling))


async def run_personas(job: SynthesisJob, meter: UsageMeter) -> list[PersonaOutcome]:
    """Every persona, ``persona_concurrency`` at a time, in index order when done."""
    from tqdm import tqdm

    cfg, scfg = job.cfg, job.scfg
    ctx = synth_context(job, meter)
    limit = asyncio.Semaphore(scfg.persona_concurrency)
    journeys = job.output_dir / "journeys"

    async def one(t: PersonaTemplate) -> PersonaOutcome:
        async with limit:
            store = JourneyStore.open(journeys, t, make_template(scfg.seed, t.index), scfg.seed)
            return await synthesize_persona(ctx, scfg, t, store)

    outcomes = []
    progress = bool(cfg.runtime.progress) and sys.stderr.isatty()
    with tqdm(total=len(job.templates), desc="synthesis", unit="persona", disable=not progress) as bar:
        for future in asyncio.as_completed([one(t) for t in job.templates]):
            outcomes.append(await future)
            bar.update()
    await drain_background_tasks()
    return sorted(outcomes, key=lambda o: o.index)


def write_outputs(job: SynthesisJob, outcomes: list[PersonaOutcome], metrics: dict[str, float],
                  meter: UsageMeter) -> list[Path]:
    """personas.json, instances.jsonl, validation.json/.csv and metrics.json; returns their paths."""
    out = job.output_dir
    personas = []
    for o, t in zip(outcomes, job.templates):
        p = o.journey.get("persona") or {}
        personas.append({"persona_id": p.get("persona_id"), **t.to_dict(), "description": p.get("description"),
                         "occupation": p.get("occupation"), "status": o.journey.get("status"),
                         "failed_phase": o.failed_phase, "error": o.error})
    write_json(out / "personas.json", personas)
    write_jsonl(job.instances_path, [r for o in outcomes for r in o.instances])
    write_json(out / "validation.json", {
        "summary": {k: v for k, v in metrics.items() if k.startswith("validation/")},
        "instances": [v for o in outcomes for v in o.validation]})
    atomic_write_text(out / "validation.csv", validation_table(outcomes).to_csv(index=False))
    write_json(out / "metrics.json", {
        "metrics": metrics, "usage": meter.as_dict(),
        "personas": [{"index": o.index, "status": o.journey.get("status"), "failed_phase": o.failed_phase,
                      "error": o.error, "dropped_instances": o.dropped} for o in outcomes],
        "prompts_digest": job.digest})
    return [out / "personas.json", job.instances_path, out / "validation.json", out / "validation.csv",
            out / "metrics.json"]


def publish(job: SynthesisJob, outcomes: list[PersonaOutcome], meter: UsageMeter, started: float,
            tracker: RunTracker | None) -> Completeness:
    """Files, then the console report, then MLflow (metrics, tags, artifacts, table) and the run's end."""
    completeness = Completeness.of(outcomes, job.cfg.runtime.max_failed_fraction)
    metrics = summary_metrics(outcomes, meter, completeness.max_failed_fraction)
    metrics["time/seconds"] = time.perf_counter() - started
    files = write_outputs(job, outcomes, metrics, meter)
    where = str(job.output_dir)
    if tracker is not None:
        where += f" | MLflow run {tracker.run_id} at {job.cfg.tracking.uri}"
    print(render_report(job.scfg, metrics, outcomes, job.instances_path, where, completeness.status_line()),
          flush=True)
    if tracker is not None:
        tracker.log_metrics(metrics)
        tracker.set_tags({"cupid.complete": str(not completeness.failed).lower(),
                          "cupid.failed_personas": completeness.failed})
        tracker.log_artifacts(files)
        tracker.log_table(validation_table(outcomes), "instances_table.json")
        tracker.end("FINISHED")
    return completeness


def run_synthesis(cfg: DictConfig, output_dir: Path, choices: Mapping[str, str] | None = None,
                  parent_run: str | SweepParent | None = None) -> Outcome:
    """Run one synthesis job end to end.

    Returns ``Outcome("ok", value=<instances written>)``, or ``Outcome("incomplete", reason)`` (exit 3)
    when the share of failed personas is above ``runtime.max_failed_fraction``; the outputs of the
    personas that finished are written either way. A bad value raises ConfigError, an unreachable
    seed source SynthesisError (exit 2, before any call); a bug propagates (exit 1), the MLflow run
    then ends FAILED (KILLED on Ctrl-C) and the journey files keep what finished.
    """
    started = time.perf_counter()
    job = plan(cfg, output_dir)
    tracker = start_tracking(job, choices or {}, parent_run)
    meter = UsageMeter()
    log.info("synthesising %d personas into %s", len(job.templates), output_dir)
    with ends_on_error(tracker):
        outcomes = asyncio.run(run_personas(job, meter))
        completeness = publish(job, outcomes, meter, started, tracker)
    count = float(sum(len(o.instances) for o in outcomes))
    if completeness.over_threshold:
        return Outcome("incomplete", completeness.status_line(), count)
    return Outcome("ok", "", count)
