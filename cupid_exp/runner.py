"""One job: load data, call models, score, write outputs, log to MLflow, print the table."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from cupid_exp.data.loading import load_instances
from cupid_exp.data.schema import Instance
from cupid_exp.journal import Journal, job_identity
from cupid_exp.llm.client import LLMClient, UsageMeter, configure_litellm, drain_background_tasks
from cupid_exp.llm.server import managed_server
from cupid_exp.metrics import error_counts, flat_metrics, generation_metrics, inference_metrics, retrieval_metrics
from cupid_exp.outputs import write_json, write_jsonl
from cupid_exp.prompts import EVALUATION_PROMPTS, PromptSet
from cupid_exp.rendering import matcher_examples
from cupid_exp.plots import save_run_plots
from cupid_exp.progress import Progress
from cupid_exp.secrets import install_log_scrubber, scrub_obj, secret_values
from cupid_exp.stats import ci_metrics
from cupid_exp.tracking import git_state
from cupid_exp.retrieval import score_retrieval
from cupid_exp.settings import context_text, relevant_positions, shown_positions, validate_combination
from cupid_exp.tasks.base import EvalContext, InstanceRecord, StepFailed
from cupid_exp.tasks.generation import run_generation
from cupid_exp.tasks.inference import run_inference

log = logging.getLogger(__name__)

TASK_PARTS = {"inference": ("inference",), "generation": ("generation",), "both": ("inference", "generation")}
METRICS = {"inference": inference_metrics, "generation": generation_metrics}


@dataclass
class JobResult:
    metrics: dict[str, float]
    records: list[dict[str, Any]]
    run_id: str | None
    output_dir: Path


def _clients(cfg: DictConfig, meter: UsageMeter) -> dict[str, LLMClient]:
    """One client per distinct model config, so roles on the same model share its concurrency."""
    by_identity: dict[str, LLMClient] = {}
    roles = {"subject": cfg.model, "decomposer": cfg.evaluator.decomposer,
             "matcher": cfg.evaluator.matcher, "judge": cfg.evaluator.judge}
    out = {}
    for role, model_cfg in roles.items():
        identity = json.dumps(OmegaConf.to_container(model_cfg, resolve=True), sort_keys=True)
        if identity not in by_identity:
            by_identity[identity] = LLMClient(OmegaConf.to_object(model_cfg), cfg.runtime, meter)
        out[role] = by_identity[identity]
    return out


def build_context(cfg: DictConfig, prompts: PromptSet, meter: UsageMeter) -> EvalContext:
    """Clients for every role plus the prompt set: everything a task needs besides the instance."""
    return EvalContext(**_clients(cfg, meter), prompts=prompts, reask=cfg.runtime.reask,
                       matcher_prompt=cfg.evaluator.matcher_prompt,
                       matcher_examples=(matcher_examples(prompts.matcher_examples())
                                         if cfg.evaluator.matcher_few_shot else None),
                       max_checklist_items=cfg.evaluator.max_checklist_items)


def _new_record(instance: Instance, n_sessions: int) -> InstanceRecord:
    return InstanceRecord(key=instance.key, persona_id=instance.persona_id, instance_type=instance.instance_type,
                          values={"gt_preference": instance.current_contextual_preference,
                                  "gt_checklist": list(instance.current_checklist),
                                  "gt_checklist_len": len(instance.current_checklist),
                                  "context_factor": instance.current_context_factor,
                                  "n_context_sessions": n_sessions,
                                  "relevant_positions": relevant_positions(instance),
                                  "n_prior_sessions": len(instance.prior_interactions),
                                  "history_words": sum(len(m.content.split()) for s in instance.prior_interactions
                                                       for m in s.dialogue)})


async def _guarded(record: InstanceRecord, coro, progress: Progress | None = None, stage: str = "") -> None:
    """Run one task on one instance; a failed step is recorded, and the other task goes on."""
    try:
        await coro
    except StepFailed as exc:
        record.add_error(exc)
        log.warning("instance %s: %s", record.key, exc)
    finally:
        if progress is not None:
            progress.done(stage)


def stages(cfg: DictConfig) -> list[str]:
    return (["summary"] if cfg.setting.name == "summary" else []) + list(TASK_PARTS[cfg.task.name])


async def evaluate_instance(cfg: DictConfig, ctx: EvalContext, instance: Instance,
                            progress: Progress | None = None) -> InstanceRecord:
    setting = cfg.setting
    positions = await asyncio.to_thread(shown_positions, instance, setting)
    sessions = [instance.prior_interactions[i - 1] for i in positions]
    record = _new_record(instance, len(sessions))
    if setting.name == "retrieval":
        record.values["retrieved_positions"] = positions
        record.values["retrieval"] = score_retrieval(instance, positions, record.values["relevant_positions"])
    if setting.name == "oracle" and len(sessions) != setting.expected_oracle_sessions:
        record.values["data_warnings"] = [f"oracle kept {len(sessions)} sessions, expected "
                                          f"{setting.expected_oracle_sessions}"]
        log.warning("data warning: %s: oracle kept %d sessions (expected %d)", instance.key, len(sessions),
                    setting.expected_oracle_sessions)
    parts = TASK_PARTS[cfg.task.name]
    try:
        log_text = await context_text(ctx, instance, sessions, setting, record)
    except StepFailed as exc:
        record.add_error(exc)
        log.warning("instance %s: %s", record.key, exc)
        for stage in stages(cfg) if progress is not None else ():
            progress.done(stage)
        return record
    if progress is not None and setting.name == "summary":
        progress.done("summary")
    coros = []
    if "inference" in parts:
        coros.append(_guarded(record, run_inference(ctx, instance, log_text, record), progress, "inference"))
    if "generation" in parts:
        coros.append(_guarded(record, run_generation(ctx, instance, log_text, record, setting_name=setting.name,
                                                     include_log=setting.include_log), progress, "generation"))
    await asyncio.gather(*coros)
    return record


async def _run_all(cfg: DictConfig, ctx: EvalContext, instances: list[Instance],
                   journal: Journal | None = None) -> list[InstanceRecord]:
    progress = Progress(stages(cfg), len(instances), ctx.subject.meter, enabled=bool(cfg.runtime.progress))

    async def one(instance: Instance) -> InstanceRecord:
        record = await evaluate_instance(cfg, ctx, instance, progress)
        if journal is not None:
            journal.append(record.to_dict())
        return record

    records: dict[str, InstanceRecord] = {}
    try:
        for future in asyncio.as_completed([one(i) for i in instances]):
            record = await future
            records[record.key] = record
    finally:
        progress.close()
    await drain_background_tasks()
    return list(records.values())


def _usage_metrics(meter: UsageMeter) -> dict[str, float]:
    out: dict[str, float] = {}
    for step, counts in meter.as_dict().items():
        out[f"calls/{step}"] = counts.get("calls", 0.0)
        out[f"calls/{step}/cache_hits"] = counts.get("cache_hits", 0.0)
        out[f"tokens/{step}/prompt"] = counts.get("prompt_tokens", 0.0)
        out[f"tokens/{step}/completion"] = counts.get("completion_tokens", 0.0)
    totals = meter.totals()
    out["calls/total"] = totals.get("calls", 0.0)
    out["calls/cache_hits"] = totals.get("cache_hits", 0.0)
    out["calls/unpriced"] = totals.get("unpriced_calls", 0.0)
    out["calls/retries"] = totals.get("retries", 0.0)
    out["calls/gave_up"] = sum(v for k, v in totals.items() if k.startswith("failed_") and "unparseable" not in k)
    out["tokens/prompt"] = totals.get("prompt_tokens", 0.0)
    out["tokens/completion"] = totals.get("completion_tokens", 0.0)
    out["cost/usd"] = totals.get("cost_usd", 0.0)
    return out


def results_table(nested: Mapping[str, Any]) -> pd.DataFrame:
    rows = []
    for group, block in nested.items():
        if group == "counts":
            continue
        row: dict[str, Any] = {"instances": group, "n": block.get("n", 0)}
        row.update({k: round(100 * block[k], 1) for k in ("precision", "recall", "f1", "micro/precision",
                                                          "micro/recall", "micro/f1") if k in block})
        if "score" in block:
            row["score (1-10)"] = round(block["score"], 2)
        rows.append(row)
    return pd.DataFrame(rows).set_index("instances").fillna("-")


def instance_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Per-instance rows for mlflow.log_table: scalars as-is, containers as JSON text."""
    rows = []
    for rec in records:
        row = {k: (json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v)
               for k, v in rec.items() if k != "raw"}
        rows.append(row)
    return pd.DataFrame(rows)


def run_job(cfg: DictConfig, output_dir: Path, *, choices: Mapping[str, str] | None = None,
            parent_run: str | None = None) -> JobResult:
    start = time.perf_counter()
    if cfg.task.name not in TASK_PARTS:
        raise ValueError(f"task={cfg.task.name!r} is not available; choose one of {sorted(TASK_PARTS)}")
    validate_combination(cfg.task.name, cfg.setting.name)
    secrets = secret_values(OmegaConf.to_container(cfg, resolve=True))
    install_log_scrubber(secrets)
    data = load_instances(cfg.data)
    prompts = PromptSet(cfg.prompts.dir)
    meter = UsageMeter()
    log.info("%d instances from %s (%d bad rows); model=%s evaluator=%s", len(data.instances), data.source,
             len(data.errors), cfg.model.name, cfg.evaluator.name)
    journal = None
    done: dict[str, dict[str, Any]] = {}
    dry_run = bool(cfg.runtime.dry_run)
    if cfg.runtime.resume and not dry_run:
        identity = job_identity(cfg, dataset_digest=data.digest, prompts_digest=prompts.digest(EVALUATION_PROMPTS))
        journal = Journal(Path(cfg.paths.output_root) / "journal" / f"{identity}.jsonl", secrets)
        done = journal.load()
        done = {i.key: done[i.key] for i in data.instances if i.key in done}
        if done:
            log.info("resuming: %d of %d instances already finished (journal %s)", len(done),
                     len(data.instances), journal.path)
    todo = [i for i in data.instances if i.key not in done]
    if todo:  # importing litellm takes seconds: a re-run that finds every instance done skips it
        configure_litellm(cfg.runtime)
        ctx = build_context(cfg, prompts, meter)
    with managed_server(cfg.evaluator.server if todo and not dry_run else None):
        model_start, model_cpu = time.perf_counter(), time.process_time()  # without a model server's start-up
        fresh = {r.key: r.to_dict() for r in asyncio.run(_run_all(cfg, ctx, todo, journal))} if todo else {}
        model_seconds, model_cpu = time.perf_counter() - model_start, time.process_time() - model_cpu
    records = [done.get(i.key) or fresh[i.key] for i in data.instances]  # dataset order

    nested = {part: METRICS[part](records, cfg.runtime.failure_policy) for part in TASK_PARTS[cfg.task.name]}
    errors = error_counts(records)
    metrics: dict[str, float] = {}
    for part, block in nested.items():
        metrics.update(flat_metrics(part, block))
    metrics.update(_usage_metrics(meter))
    if cfg.setting.name == "retrieval":
        metrics.update(retrieval_metrics(records))
    metrics["resume/instances_from_journal"] = float(len(done))
    metrics["data/oracle_count_warnings"] = float(sum(1 for r in records if r.get("data_warnings")))
    metrics.update({f"errors/{k}": float(v) for k, v in errors.items()})
    metrics["data/bad_rows"] = float(len(data.errors))
    metrics["time/seconds"] = time.perf_counter() - start
    metrics["time/model_seconds"] = model_seconds  # calling models (and scoring), without start-up or logging
    metrics["time/model_cpu_seconds"] = model_cpu  # this process's CPU time in that phase (orchestration cost)

    records = scrub_obj(records, secrets)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(output_dir / "instances.jsonl", records)
    if not dry_run and records:
        metrics.update(ci_metrics(records, cfg.task.name, seed=cfg.seed, failure_policy=cfg.runtime.failure_policy))
    summary = {"dry_run": dry_run, "git": git_state(), "metrics": metrics, "breakdown": nested, "errors": errors, "usage": meter.as_dict(),
               "data": {"source": data.source, "digest": data.digest, "instances": len(data.instances),
                        "bad_rows": [str(e) for e in data.errors]},
               "prompts_digest": prompts.digest(EVALUATION_PROMPTS)}
    write_json(output_dir / "metrics.json", summary)

    run_id = None
    if dry_run:
        print(render_dry_run(cfg, meter))
        return JobResult(metrics=metrics, records=records, run_id=None, output_dir=output_dir)
    if cfg.tracking.enabled:
        from cupid_exp.tracking import log_job

        run_id = log_job(
            cfg, run_name=cfg.tracking.run_name or f"{cfg.model.name}-{cfg.task.name}-{cfg.setting.name}",
            choices=choices or {}, metrics=metrics, table=instance_table(records), parent=parent_run,
            tags={"dataset_digest": data.digest, "dataset_source": data.source,
                  "prompts_digest": prompts.digest(EVALUATION_PROMPTS), "output_dir": str(output_dir.resolve())},
            artifacts=[output_dir / "instances.jsonl", output_dir / "metrics.json"],
            artifact_dirs={"plots": _plots(cfg, records, output_dir),
                           ".hydra": sorted((output_dir / ".hydra").glob("*.yaml"))})
    print(render_report(cfg, nested, errors, metrics, data.errors, output_dir, run_id))
    return JobResult(metrics=metrics, records=records, run_id=run_id, output_dir=output_dir)


def render_report(cfg: DictConfig, nested: Mapping[str, Any], errors: Mapping[str, int],
                  metrics: Mapping[str, float], bad_rows: list, output_dir: Path, run_id: str | None) -> str:
    lines = ["", f"CUPID {cfg.task.name} | model={cfg.model.name} setting={cfg.setting.name} "
                 f"evaluator={cfg.evaluator.name} data={cfg.data.name}"]
    for part, block in nested.items():
        counts = block.get("counts", {})
        if part == "inference":
            lines.append("inference P/R/F1 in %: macro (paper: mean per-instance P and R, F1 = their harmonic "
                         "mean) and micro (pooled, upstream)")
        else:
            lines.append("generation: mean judge score (1-10)")
        lines += [results_table(block).to_string(),
                  f"{part} instances: {counts.get('instances', 0)} run, {counts.get('scored', 0)} scored, "
                  f"{counts.get('failed', 0)} failed (policy: {counts.get('failure_policy', '-')})"]
    warnings = int(metrics.get("data/oracle_count_warnings", 0))
    lines += [
        f"bad data rows skipped: {len(bad_rows)}" + (f"; oracle count warnings: {warnings}" if warnings else ""),
        "failed steps: " + (", ".join(f"{k}={v}" for k, v in sorted(errors.items()) if "/" in k) or "none"),
        f"calls: {int(metrics.get('calls/total', 0))} ({int(metrics.get('calls/cache_hits', 0))} cached), "
        f"tokens: {int(metrics.get('tokens/prompt', 0))} in / {int(metrics.get('tokens/completion', 0))} out, "
        f"cost: ${metrics.get('cost/usd', 0.0):.4f}, time: {metrics.get('time/seconds', 0.0):.1f}s",
        f"outputs: {output_dir}" + (f" | MLflow run {run_id} at {cfg.tracking.uri}" if run_id else ""),
    ]
    return "\n".join(lines)


def _plots(cfg: DictConfig, records: list[dict[str, Any]], output_dir: Path) -> list[Path]:
    """Score by type, F1 vs relevant-session position (paper Fig. 3), score vs history length (Fig. 9)."""
    try:
        return save_run_plots(records, cfg.task.name, output_dir / "plots", seed=cfg.seed,
                              failure_policy=cfg.runtime.failure_policy,
                              title_prefix=f"{cfg.model.name} {cfg.setting.name}")
    except Exception as exc:  # a plot must never cost the run its results
        log.warning("plots skipped: %s: %s", type(exc).__name__, exc)
        return []


def render_dry_run(cfg: DictConfig, meter: UsageMeter) -> str:
    """Calls, tokens and estimated cost per step; nothing was sent to any model."""
    rows = [{"step": step, "calls": int(c.get("calls", 0)), "prompt tokens": int(c.get("prompt_tokens", 0)),
             "completion tokens (est.)": int(c.get("completion_tokens", 0)),
             "cost USD (est.)": round(c.get("cost_usd", 0.0), 4), "unpriced calls": int(c.get("unpriced_calls", 0))}
            for step, c in meter.as_dict().items()]
    totals = meter.totals()
    table = pd.DataFrame(rows).set_index("step").to_string() if rows else "(no calls)"
    return "\n".join([
        "", f"DRY RUN (no model was called) | model={cfg.model.name} task={cfg.task.name} "
            f"setting={cfg.setting.name} evaluator={cfg.evaluator.name} data={cfg.data.name}",
        table,
        f"total: {int(totals.get('calls', 0))} calls, {int(totals.get('prompt_tokens', 0))} prompt tokens, "
        f"~{int(totals.get('completion_tokens', 0))} completion tokens, ~${totals.get('cost_usd', 0.0):.4f}"
        + (f" ({int(totals.get('unpriced_calls', 0))} calls unpriced)" if totals.get("unpriced_calls") else ""),
    ])
