"""One synthesis job: personas -> factors -> sessions -> checklists -> dialogues -> instances -> validation.

Each persona's artefacts live in ``journeys/persona_NNN.json`` in the job dir, rewritten atomically
after every step, so a killed job re-run with the same command skips finished personas, phases and
sessions; every model call goes through LLMClient, whose disk cache serves any call that finished.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from cupid_exp.data.schema import INSTANCE_TYPES, DataError, validate_row
from cupid_exp.llm.client import LLMClient, configure_litellm, drain_background_tasks
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.outputs import atomic_write_text, write_json, write_jsonl
from cupid_exp.prompts import PromptSet
from cupid_exp.synthesis import steps
from cupid_exp.synthesis.config import ROLES, SynthesisConfig, SynthesisError, check_synthesis_config
from cupid_exp.synthesis.journey import (CHANGED, N_SESSIONS, JourneyTemplate, build_instances,
                                         make_template, persona_id, plan_factors, relevant_checks,
                                         removed_sessions, session_task_type, slot_preference)
from cupid_exp.synthesis.personas import (PersonaTemplate, builtin_seeds, personahub_seeds, render_template,
                                          sample_templates)

log = logging.getLogger(__name__)

SYNTHESIS_PROMPTS = ("persona_generator", "context_factors_generator", "preference_changer", "sessions_generator",
                     "preference_decomposer", "user_simulator", "assistant_simulator", "expression_validator")


@dataclass
class PersonaOutcome:
    index: int
    journey: dict[str, Any]
    failed_phase: str | None = None
    error: str | None = None
    instances: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, str]] = field(default_factory=list)
    validation: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class SynthesisResult:
    metrics: dict[str, float]
    instances_path: Path
    run_id: str | None
    output_dir: Path


class JourneyStore:
    """One persona's journey file; every ``save`` replaces it atomically."""

    def __init__(self, path: Path, data: dict[str, Any]):
        self.path, self.data = path, data

    @classmethod
    def open(cls, directory: Path, template: PersonaTemplate, journey: JourneyTemplate, seed: int) -> "JourneyStore":
        path = directory / f"persona_{template.index:03d}.json"
        fresh = json.loads(json.dumps({"persona_index": template.index, "template": template.to_dict(),
                                       "journey": journey.to_dict(),
                                       "factor_plan": plan_factors(seed, template.index)}))
        if path.exists():
            data = json.loads(path.read_text(encoding="utf-8"))
            if all(data.get(k) == fresh[k] for k in ("template", "journey", "factor_plan")):
                return cls(path, data)
            log.warning("%s was written for another template; starting that persona again", path)
        store = cls(path, fresh)
        store.save()
        return store

    def save(self) -> None:
        atomic_write_text(self.path, json.dumps(self.data, indent=2, ensure_ascii=False) + "\n")


def _clients(roles: Mapping[str, Any], runtime: Any, meter: UsageMeter) -> dict[str, LLMClient]:
    """One client per distinct model config, so roles on one model share its concurrency limit."""
    by_identity: dict[str, LLMClient] = {}
    out = {}
    for role in ROLES:
        model_cfg = roles[role]
        identity = json.dumps(OmegaConf.to_container(model_cfg, resolve=True), sort_keys=True)
        if identity not in by_identity:
            by_identity[identity] = LLMClient(OmegaConf.to_object(model_cfg), runtime, meter)
        out[role] = by_identity[identity]
    return out


# ---------------------------------------------------------------------------------------------
# one persona


async def _synthesize_persona(ctx: steps.SynthContext, scfg: SynthesisConfig, template: PersonaTemplate,
                              store: JourneyStore) -> PersonaOutcome:
    j = store.data
    journey = JourneyTemplate.from_dict(j["journey"])
    outcome = PersonaOutcome(index=template.index, journey=j)
    phase = "persona"
    try:
        if "persona" not in j:
            persona = await steps.write_persona(ctx, render_template(template))
            j["persona"] = {**persona, "persona_id": persona_id(template.index, persona["occupation"])}
            store.save()
        description = j["persona"]["description"]

        phase = "factors"
        if "factors" not in j:
            def keep(partial: list[dict]) -> None:
                j["factors_partial"] = partial
                store.save()

            j["factors"] = await steps.write_factors(ctx, description, j["factor_plan"],
                                                     done=j.get("factors_partial"), on_factor=keep)
            j.pop("factors_partial", None)
            store.save()
        factors = j["factors"]

        phase = "changed_preference"
        current = factors[journey.current_factor]
        if "changed" not in j:
            others = [f["preference"] for f in factors]
            j["changed"] = await steps.write_changed_preference(ctx, description, current, others)
            store.save()
        changed = j["changed"]["preference"]

        phase = "sessions"
        sessions = j.setdefault("sessions", [None] * N_SESSIONS)
        first_changed = min(journey.positions(CHANGED))
        for slot in journey.slots:
            if sessions[slot.index] is not None:
                continue
            sessions[slot.index] = await steps.write_session(
                ctx, persona_description=description, factor=factors[slot.factor],
                preference=slot_preference(slot, factors, changed), session_number=slot.index + 1,
                task_type=session_task_type(scfg.seed, template.index, slot.index, factors[slot.factor]["task_types"]),
                n_sessions=N_SESSIONS, earlier=sessions[: slot.index],
                shift_reason=j["changed"]["reason"] if slot.index == first_changed else None)
            sessions[slot.index]["context_factor"] = factors[slot.factor]["factor"]
            sessions[slot.index]["preference"] = slot_preference(slot, factors, changed)
            sessions[slot.index]["kind"] = slot.kind
            store.save()

        phase = "checklists"
        checklists = j.setdefault("checklists", {})
        needed = list(dict.fromkeys([f["preference"] for f in factors] + [changed]))

        async def checklist(pref: str) -> None:
            if pref not in checklists:
                checklists[pref] = await steps.decompose(ctx, pref)
                store.save()

        await _gather_all([checklist(p) for p in needed])

        phase = "dialogues"
        dialogues = j.setdefault("dialogues", [None] * (N_SESSIONS - 1))

        async def dialogue(slot_index: int) -> None:
            slot = journey.slots[slot_index]
            pref = slot_preference(slot, factors, changed)
            record = dialogues[slot_index]
            while True:
                if record is None:
                    record = await steps.simulate_dialogue(
                        ctx, persona_description=description, factor=factors[slot.factor]["factor"],
                        preference=pref, checklist=checklists[pref],
                        request=steps.first_message(sessions[slot_index]), attempt=0)
                elif (scfg.on_unsatisfied == "regenerate" and not record["is_satisfied"]
                      and record["attempt"] < scfg.max_retries):
                    ctx.fail("dialogue", "unsatisfied_attempt")
                    record = await steps.simulate_dialogue(
                        ctx, persona_description=description, factor=factors[slot.factor]["factor"],
                        preference=pref, checklist=checklists[pref],
                        request=steps.first_message(sessions[slot_index]), attempt=record["attempt"] + 1)
                else:
                    break
                dialogues[slot_index] = record
                store.save()

        await _gather_all([dialogue(i) for i in range(N_SESSIONS - 1)])

        phase = "instances"
        rows = build_instances(j["persona"]["persona_id"], journey, factors, changed, checklists, sessions,
                               [d["dialogue"] for d in dialogues])
        kept, dropped = filter_unsatisfied(rows, journey, dialogues, scfg.on_unsatisfied)
        outcome.dropped += dropped
        for row in kept:
            try:
                validate_row(row, f"persona {template.index}")
            except DataError as exc:
                ctx.fail("instances", "schema_invalid")
                outcome.dropped.append({"persona_id": row["persona_id"], "instance_type": row["instance_type"],
                                        "reason": str(exc)})
                continue
            outcome.instances.append(row)
        j["instances"], j["dropped_instances"] = outcome.instances, outcome.dropped
        store.save()

        phase = "validation"
        if scfg.validate:
            if "validation" not in j:
                j["validation"] = await _validate_persona(ctx, journey, factors, changed, checklists, dialogues,
                                                          outcome.instances)
                store.save()
            outcome.validation = j["validation"]
    except steps.StepFailed as exc:
        outcome.failed_phase, outcome.error = phase, str(exc)
        log.warning("persona %d failed at %s: %s", template.index, phase, exc)
    except Exception as exc:  # a bug or an unexpected reply shape: report it, keep the other personas going
        outcome.failed_phase, outcome.error = phase, f"{type(exc).__name__}: {exc}"
        ctx.fail(phase, "error")
        log.exception("persona %d failed at %s", template.index, phase)
    j["status"] = "failed" if outcome.failed_phase else "done"
    j["failed_phase"], j["error"] = outcome.failed_phase, outcome.error
    store.save()
    return outcome


def filter_unsatisfied(rows: list[dict[str, Any]], journey: JourneyTemplate, dialogues: list[dict[str, Any]],
                       policy: str) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """``keep``: every row (unsatisfied dialogues stay flagged in the journey file); otherwise a row is
    dropped when one of its 8 prior sessions ended unsatisfied (after regeneration, for ``regenerate``)."""
    unsatisfied = {i for i, d in enumerate(dialogues) if not d["is_satisfied"]}
    kept, dropped = [], []
    for row in rows:
        used = set(range(N_SESSIONS - 1)) - set(removed_sessions(journey, row["instance_type"]))
        if policy != "keep" and used & unsatisfied:
            dropped.append({"persona_id": row["persona_id"], "instance_type": row["instance_type"],
                            "reason": f"unsatisfied dialogues in sessions {sorted(i + 1 for i in used & unsatisfied)}"})
        else:
            kept.append(row)
    return kept, dropped


async def _gather_all(coros: list) -> None:
    """Run all; after every one has finished, re-raise the first failure (so finished work is saved)."""
    results = await asyncio.gather(*coros, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r


async def _validate_persona(ctx: steps.SynthContext, journey: JourneyTemplate, factors: list[dict],
                            changed: str, checklists: Mapping[str, list[str]], dialogues: list[dict],
                            instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Paper App. E: per instance, which checklist items the relevant sessions' user messages express,
    and which the current request leaks. Identical checks are asked once per persona."""
    memo: dict[tuple, asyncio.Task] = {}

    def ask(checklist: list[str], messages: list[str], step: str) -> asyncio.Task:
        key = (tuple(checklist), tuple(messages))
        if key not in memo:
            memo[key] = asyncio.ensure_future(steps.check_expressed(ctx, checklist, messages, step))
        return memo[key]

    async def one(row: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"persona_id": row["persona_id"], "instance_type": row["instance_type"],
                               "checks": [], "errors": []}
        for role, pref, positions in relevant_checks(journey, factors, changed, row["instance_type"]):
            user_messages = [m["content"] for i in positions for m in dialogues[i]["dialogue"] if m["role"] == "user"]
            check = {"preference_role": role, "preference": pref, "sessions": [i + 1 for i in positions],
                     "checklist": checklists[pref]}
            try:
                check["expressed"] = await ask(checklists[pref], user_messages, "validate_expressed")
            except steps.StepFailed as exc:
                check["expressed"], check["error"] = None, str(exc)
                out["errors"].append(str(exc))
            out["checks"].append(check)
        try:
            leaked = await ask(row["current_checklist"], [row["current_request"]], "validate_leak")
        except steps.StepFailed as exc:
            leaked = None
            out["errors"].append(str(exc))
        out["leaked"] = leaked
        return out

    return list(await asyncio.gather(*(one(r) for r in instances)))


# ---------------------------------------------------------------------------------------------
# the job


async def _run_personas(ctx: steps.SynthContext, scfg: SynthesisConfig, templates: list[PersonaTemplate],
                        journeys_dir: Path, progress: bool) -> list[PersonaOutcome]:
    from tqdm import tqdm

    limit = asyncio.Semaphore(max(1, scfg.persona_concurrency))

    async def one(t: PersonaTemplate) -> PersonaOutcome:
        async with limit:
            store = JourneyStore.open(journeys_dir, t, make_template(scfg.seed, t.index), scfg.seed)
            if store.data.get("status") == "done" and (store.data.get("validation") is not None or not scfg.validate):
                return PersonaOutcome(index=t.index, journey=store.data, instances=store.data["instances"],
                                      dropped=store.data.get("dropped_instances", []),
                                      validation=store.data.get("validation") or [])
            return await _synthesize_persona(ctx, scfg, t, store)

    outcomes = []
    with tqdm(total=len(templates), desc="synthesis", unit="persona", disable=not progress) as bar:
        for future in asyncio.as_completed([one(t) for t in templates]):
            outcomes.append(await future)
            bar.update()
    await drain_background_tasks()
    return sorted(outcomes, key=lambda o: o.index)


def validation_table(outcomes: list[PersonaOutcome]) -> pd.DataFrame:
    rows = []
    for o in outcomes:
        for v in o.validation:
            row = {"persona_id": v["persona_id"], "instance_type": v["instance_type"]}
            for check in v["checks"]:
                flags = check.get("expressed")
                row[f"{check['preference_role']}_items"] = len(check["checklist"])
                row[f"{check['preference_role']}_expressed"] = sum(flags) if flags is not None else None
            leaked = v.get("leaked")
            row["leak_items"] = len(leaked) if leaked is not None else None
            row["leaked"] = sum(leaked) if leaked is not None else None
            row["all_expressed"] = all(c.get("expressed") is not None and all(c["expressed"]) for c in v["checks"])
            row["errors"] = len(v["errors"])
            rows.append(row)
    return pd.DataFrame(rows)


def summary_metrics(outcomes: list[PersonaOutcome], ctx: steps.SynthContext, meter: UsageMeter,
                    n_requested: int) -> dict[str, float]:
    m: dict[str, float] = {"personas/requested": n_requested,
                           "personas/completed": sum(1 for o in outcomes if not o.failed_phase),
                           "personas/failed": sum(1 for o in outcomes if o.failed_phase)}
    for phase, n in Counter(o.failed_phase for o in outcomes if o.failed_phase).items():
        m[f"personas/failed/{phase}"] = n
    journeys = [o.journey for o in outcomes]
    m["factors/count"] = sum(len(j.get("factors") or []) for j in journeys)
    m["sessions/count"] = sum(sum(1 for s in j.get("sessions") or [] if s) for j in journeys)
    dialogues = [d for j in journeys for d in j.get("dialogues") or [] if d]
    m["dialogues/count"] = len(dialogues)
    m["dialogues/satisfied"] = sum(1 for d in dialogues if d["is_satisfied"])
    m["dialogues/unsatisfied"] = len(dialogues) - m["dialogues/satisfied"]
    m["dialogues/user_sim_errors"] = sum(1 for d in dialogues if d.get("error"))
    if dialogues:
        m["dialogues/assistant_turns_mean"] = sum(sum(1 for t in d["dialogue"] if t["role"] == "assistant")
                                                  for d in dialogues) / len(dialogues)
        last = [d["scores"][-1] for d in dialogues if d["scores"]]
        if last:
            m["dialogues/final_score_mean"] = sum(last) / len(last)
    instances = [r for o in outcomes for r in o.instances]
    m["instances/count"] = len(instances)
    for t in INSTANCE_TYPES:
        m[f"instances/{t}"] = sum(1 for r in instances if r["instance_type"] == t)
    m["instances/dropped"] = sum(len(o.dropped) for o in outcomes)
    checks = [c for o in outcomes for v in o.validation for c in v["checks"]]
    judged = [c for c in checks if c.get("expressed") is not None]
    m["validation/instances"] = sum(len(o.validation) for o in outcomes)
    m["validation/items"] = sum(len(c["expressed"]) for c in judged)
    m["validation/items_expressed"] = sum(sum(c["expressed"]) for c in judged)
    if m["validation/items"]:
        m["validation/expressed_rate"] = m["validation/items_expressed"] / m["validation/items"]
    m["validation/instances_all_expressed"] = sum(
        1 for o in outcomes for v in o.validation
        if v["checks"] and all(c.get("expressed") is not None and all(c["expressed"]) for c in v["checks"]))
    leaks = [v["leaked"] for o in outcomes for v in o.validation if v.get("leaked") is not None]
    m["validation/leak_items"] = sum(sum(x) for x in leaks)
    m["validation/instances_leaking"] = sum(1 for x in leaks if any(x))
    m["validation/failed_checks"] = sum(len(v["errors"]) for o in outcomes for v in o.validation)
    for step, kinds in ctx.failures.items():
        for kind, n in kinds.items():
            m[f"errors/{step}/{kind}"] = n
    for step, counts in meter.as_dict().items():
        m[f"calls/{step}"] = counts.get("calls", 0.0)
        m[f"calls/{step}/cache_hits"] = counts.get("cache_hits", 0.0)
        m[f"tokens/{step}/prompt"] = counts.get("prompt_tokens", 0.0)
        m[f"tokens/{step}/completion"] = counts.get("completion_tokens", 0.0)
    totals = meter.totals()
    m["calls/total"] = totals.get("calls", 0.0)
    m["calls/cache_hits"] = totals.get("cache_hits", 0.0)
    m["calls/unpriced"] = totals.get("unpriced_calls", 0.0)
    m["tokens/prompt"] = totals.get("prompt_tokens", 0.0)
    m["tokens/completion"] = totals.get("completion_tokens", 0.0)
    m["cost/usd"] = totals.get("cost_usd", 0.0)
    return {k: float(v) for k, v in m.items()}


def prompts_digest(prompts: PromptSet) -> str:
    h = hashlib.sha256()
    for name in SYNTHESIS_PROMPTS:
        h.update(name.encode() + b"\0" + prompts._path(f"synthesis/{name}.yaml").read_bytes())
    return h.hexdigest()[:16]


def run_synthesis(cfg: DictConfig, output_dir: Path, *, choices: Mapping[str, str] | None = None,
                  parent_run: str | None = None) -> SynthesisResult:
    start = time.perf_counter()
    scfg: SynthesisConfig = OmegaConf.to_object(cfg.synthesis)
    check_synthesis_config(scfg)
    if cfg.runtime.get("dry_run"):
        raise SynthesisError("runtime.dry_run is not supported by synthesis (each step needs the previous "
                             "step's real output); run without it")
    configure_litellm(cfg.runtime)
    prompts = PromptSet(cfg.prompts.dir)
    digest = prompts_digest(prompts)
    output_dir.mkdir(parents=True, exist_ok=True)
    state_path = output_dir / "state.json"
    if state_path.exists():
        previous = json.loads(state_path.read_text()).get("prompts_digest")
        if previous != digest:
            log.warning("the synthesis prompts changed since %s was started; finished artefacts are kept", output_dir)
    write_json(state_path, {"prompts_digest": digest})

    if scfg.persona_source == "personahub":
        p = scfg.personahub
        seeds = personahub_seeds(scfg.n_personas, scfg.seed, p.name, p.subset, p.split, p.text_field)
    else:
        seeds = builtin_seeds(scfg.n_personas, scfg.seed)
    templates = sample_templates(scfg.n_personas, scfg.seed, seeds)
    meter = UsageMeter()
    ctx = steps.SynthContext(clients=_clients(cfg.synthesis.roles, cfg.runtime, meter), prompts=prompts,
                             max_retries=scfg.max_retries, max_turns=scfg.max_turns,
                             max_checklist_items=scfg.max_checklist_items, with_resources=scfg.with_resources)
    log.info("synthesising %d personas into %s", len(templates), output_dir)
    progress = bool(cfg.runtime.progress) and sys.stderr.isatty()
    outcomes = asyncio.run(_run_personas(ctx, scfg, templates, output_dir / "journeys", progress))

    personas = []
    for o, t in zip(outcomes, templates):
        p = o.journey.get("persona") or {}
        personas.append({"persona_id": p.get("persona_id"), **t.to_dict(), "description": p.get("description"),
                         "occupation": p.get("occupation"), "status": o.journey.get("status"),
                         "failed_phase": o.failed_phase, "error": o.error})
    write_json(output_dir / "personas.json", personas)
    instances = [r for o in outcomes for r in o.instances]
    instances_path = output_dir / "instances" / "instances.jsonl"
    write_jsonl(instances_path, instances)
    table = validation_table(outcomes)
    metrics = summary_metrics(outcomes, ctx, meter, len(templates))
    metrics["time/seconds"] = time.perf_counter() - start
    write_json(output_dir / "validation.json", {
        "summary": {k: v for k, v in metrics.items() if k.startswith("validation/")},
        "instances": [v for o in outcomes for v in o.validation]})
    atomic_write_text(output_dir / "validation.csv", table.to_csv(index=False))
    write_json(output_dir / "metrics.json", {
        "metrics": metrics, "usage": meter.as_dict(), "failures": {k: dict(v) for k, v in ctx.failures.items()},
        "personas": [{"index": o.index, "status": o.journey.get("status"), "failed_phase": o.failed_phase,
                      "error": o.error, "dropped_instances": o.dropped} for o in outcomes],
        "prompts_digest": digest})

    run_id = None
    if cfg.tracking.enabled:
        from cupid_exp.tracking import log_job

        run_id = log_job(
            cfg, run_name=cfg.tracking.run_name or f"synthesis-{scfg.name}-{scfg.roles.session_writer.name}",
            choices=choices or {}, metrics=metrics, table=table, parent=parent_run,
            tags={"cupid.task": "synthesis", "prompts_digest": digest, "output_dir": str(output_dir.resolve()),
                  "instances_path": str(instances_path.resolve())},
            artifacts=[output_dir / "personas.json", instances_path, output_dir / "validation.json",
                       output_dir / "validation.csv", output_dir / "metrics.json"])
    print(render_report(scfg, metrics, outcomes, instances_path, output_dir, run_id, cfg.tracking.uri))
    return SynthesisResult(metrics=metrics, instances_path=instances_path, run_id=run_id, output_dir=output_dir)


def render_report(scfg: SynthesisConfig, m: Mapping[str, float], outcomes: list[PersonaOutcome],
                  instances_path: Path, output_dir: Path, run_id: str | None, uri: str) -> str:
    g = lambda k: int(m.get(k, 0))  # noqa: E731
    failed = [f"persona {o.index} at {o.failed_phase}: {o.error}" for o in outcomes if o.failed_phase]
    errors = ", ".join(f"{k.removeprefix('errors/')}={int(v)}" for k, v in sorted(m.items()) if k.startswith("errors/"))
    lines = [
        "",
        f"CUPID synthesis | recipe={scfg.name} seed={scfg.seed} session_writer={scfg.roles.session_writer.name}",
        f"personas: {g('personas/completed')}/{g('personas/requested')} completed"
        + (" | failed: " + "; ".join(failed) if failed else ""),
        f"factors: {g('factors/count')}, sessions: {g('sessions/count')}, dialogues: {g('dialogues/count')} "
        f"({g('dialogues/satisfied')} satisfied, {g('dialogues/unsatisfied')} unsatisfied; "
        f"on_unsatisfied={scfg.on_unsatisfied})",
        f"instances: {g('instances/count')} (consistent {g('instances/consistent')}, contrastive "
        f"{g('instances/contrastive')}, changing {g('instances/changing')}; dropped {g('instances/dropped')})",
        f"validation: {g('validation/items_expressed')}/{g('validation/items')} checklist items expressed, "
        f"{g('validation/instances_all_expressed')}/{g('validation/instances')} instances fully expressed, "
        f"{g('validation/instances_leaking')} requests leak, {g('validation/failed_checks')} checks failed",
        "rejected attempts and failures: " + (errors or "none"),
        f"calls: {g('calls/total')} ({g('calls/cache_hits')} cached), tokens: {g('tokens/prompt')} in / "
        f"{g('tokens/completion')} out, cost: ${m.get('cost/usd', 0.0):.4f}, time: {m.get('time/seconds', 0.0):.1f}s",
        f"instances file: {instances_path}",
        f"evaluate: python -m cupid_exp data=local data.path={instances_path}",
        f"outputs: {output_dir}" + (f" | MLflow run {run_id} at {uri}" if run_id else ""),
    ]
    return "\n".join(lines)
