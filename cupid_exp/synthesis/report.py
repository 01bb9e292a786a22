"""What a synthesis job prints: what it made, what validation found, what was rejected, what it cost."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from cupid_exp.llm.usage import usage_line
from cupid_exp.synthesis.config import SynthesisConfig
from cupid_exp.synthesis.phases import PersonaOutcome


def rejections(metrics: Mapping[str, float]) -> str:
    """Rejected replies, failed calls and kept cut replies per step."""
    parts = []
    for key, value in sorted(metrics.items()):
        step, _, kind = key.removeprefix("calls/").rpartition("/")
        if key.startswith("calls/") and step and value and (kind.endswith("_attempt") or kind.startswith("failed_")
                                                             or kind == "truncated_kept"):
            parts.append(f"{step}/{kind}={int(value)}")
    return ", ".join(parts) or "none"


def render_report(scfg: SynthesisConfig, m: Mapping[str, float], outcomes: list[PersonaOutcome],
                  instances_path: Path, where: str, status: str) -> str:
    g = lambda k: int(m.get(k, 0))  # noqa: E731
    failed = [f"persona {o.index} at {o.failed_phase}: {o.error}" for o in outcomes if o.failed_phase]
    lines = [
        "",
        f"CUPID synthesis | recipe={scfg.name} seed={scfg.seed} session_writer={scfg.roles.session_writer.name}",
        f"personas: {g('personas/completed')}/{g('personas/requested')} completed"
        + (" | failed: " + "; ".join(failed) if failed else ""),
        f"factors: {g('factors/count')} ({g('factors/names_from_taxonomy')} named from the taxonomy), "
        f"sessions: {g('sessions/count')}, dialogues: {g('dialogues/count')} "
        f"({g('dialogues/satisfied')} satisfied, {g('dialogues/unsatisfied')} unsatisfied, "
        f"{g('dialogues/regenerated')} regenerated; on_unsatisfied={scfg.on_unsatisfied})",
        f"instances: {g('instances/count')} (consistent {g('instances/consistent')}, contrastive "
        f"{g('instances/contrastive')}, changing {g('instances/changing')}; dropped {g('instances/dropped')})",
        f"validation: {g('validation/items_expressed')}/{g('validation/items')} checklist items expressed, "
        f"{g('validation/instances_all_expressed')}/{g('validation/instances')} instances fully expressed, "
        f"{g('validation/instances_leaking')} requests leak, {g('validation/failed_checks')} checks failed",
        "rejected replies and failed calls: " + rejections(m),
        usage_line(dict(m), m.get("time/seconds")),
        *_next_step(m, outcomes, instances_path),
        f"outputs: {where}",
        status,
    ]
    return "\n".join(lines)


def _next_step(m: Mapping[str, float], outcomes: list[PersonaOutcome], instances_path: Path) -> list[str]:
    """Where the instances are and how to evaluate them; when there are none, why none were written."""
    if m.get("instances/count", 0) > 0:
        return [f"instances file: {instances_path}",
                f"evaluate: python -m cupid_exp data=local data.path={instances_path}"]
    if any(o.failed_phase for o in outcomes) and not any(o.dropped for o in outcomes):
        why = "every persona failed before its instances were built (see 'failed' above)"
    elif any(o.dropped for o in outcomes):
        why = "every instance was dropped (metrics.json lists why, per persona)"
    else:
        why = "no persona produced an instance"
    return [f"no instances to evaluate ({instances_path.name} is empty): {why}; journeys/ keeps each persona's "
            "artefacts and every model reply (persona_NNN.calls.jsonl)"]
