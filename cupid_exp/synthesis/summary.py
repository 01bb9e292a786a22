"""The synthesis job's numbers (persona, dialogue, instance and validation counts, completeness) and what it prints:
what it made, what validation found, what was rejected, what it cost."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import pandas as pd

from cupid_exp.data.schema import INSTANCE_TYPES
from cupid_exp.llm.usage import UsageMeter, usage_line, usage_metrics
from cupid_exp.synthesis.config import SynthesisConfig
from cupid_exp.synthesis.phases import PersonaOutcome


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


def _dialogue_metrics(journeys: list[dict]) -> dict[str, float]:
    dialogues = [d for j in journeys for d in j.get("dialogues") or [] if d]
    m: dict[str, float] = {"dialogues/count": len(dialogues),
                           "dialogues/satisfied": sum(1 for d in dialogues if d["is_satisfied"])}
    m["dialogues/unsatisfied"] = len(dialogues) - m["dialogues/satisfied"]
    m["dialogues/regenerated"] = sum(d.get("attempt", 0) for d in dialogues)
    m["dialogues/user_sim_errors"] = sum(1 for d in dialogues if d.get("error"))
    if dialogues:
        m["dialogues/assistant_turns_mean"] = sum(sum(1 for t in d["dialogue"] if t["role"] == "assistant")
                                                  for d in dialogues) / len(dialogues)
        last = [d["scores"][-1] for d in dialogues if d["scores"]]
        if last:
            m["dialogues/final_score_mean"] = sum(last) / len(last)
    return m


def _validation_metrics(outcomes: list[PersonaOutcome]) -> dict[str, float]:
    validations = [v for o in outcomes for v in o.validation]
    judged = [c for v in validations for c in v["checks"] if c.get("expressed") is not None]
    m: dict[str, float] = {"validation/instances": len(validations),
                           "validation/items": sum(len(c["expressed"]) for c in judged),
                           "validation/items_expressed": sum(sum(c["expressed"]) for c in judged)}
    if m["validation/items"]:
        m["validation/expressed_rate"] = m["validation/items_expressed"] / m["validation/items"]
    m["validation/instances_all_expressed"] = sum(
        1 for v in validations
        if v["checks"] and all(c.get("expressed") is not None and all(c["expressed"]) for c in v["checks"]))
    leaks = [v["leaked"] for v in validations if v.get("leaked") is not None]
    m["validation/leak_items"] = sum(sum(x) for x in leaks)
    m["validation/instances_leaking"] = sum(1 for x in leaks if any(x))
    m["validation/failed_checks"] = sum(len(v["errors"]) for v in validations)
    return m


def summary_metrics(outcomes: list[PersonaOutcome], meter: UsageMeter, max_failed_fraction: float
                    ) -> dict[str, float]:
    """MLflow metrics: ``personas/``, ``dialogues/``, ``instances/``, ``validation/``, plus usage."""
    m = Completeness.of(outcomes, max_failed_fraction).metrics()
    journeys = [o.journey for o in outcomes]
    m["factors/count"] = sum(len(j.get("factors") or []) for j in journeys)
    # names swapped in by code when the model kept repeating one (steps/factors.py NameRepair)
    m["factors/names_from_taxonomy"] = sum(1 for j in journeys for f in j.get("factors") or []
                                           if f.get("name_source") == "taxonomy")
    m["sessions/count"] = sum(sum(1 for s in j.get("sessions") or [] if s) for j in journeys)
    m.update(_dialogue_metrics(journeys))
    instances = [r for o in outcomes for r in o.instances]
    m["instances/count"] = len(instances)
    for t in INSTANCE_TYPES:
        m[f"instances/{t}"] = sum(1 for r in instances if r["instance_type"] == t)
    m["instances/dropped"] = sum(len(o.dropped) for o in outcomes)
    m.update(_validation_metrics(outcomes))
    m.update(usage_metrics(meter))
    return {k: float(v) for k, v in m.items()}


@dataclass(frozen=True)
class Completeness:
    """Whether the job finished enough personas: more than ``runtime.max_failed_fraction`` failed is incomplete."""

    failed: int
    requested: int
    max_failed_fraction: float
    reasons: dict[str, int]

    @classmethod
    def of(cls, outcomes: list[PersonaOutcome], max_failed_fraction: float) -> "Completeness":
        reasons = Counter(o.failed_phase for o in outcomes if o.failed_phase)
        return cls(sum(reasons.values()), len(outcomes), max_failed_fraction, dict(reasons))

    def metrics(self) -> dict[str, float]:
        out = {"personas/requested": self.requested, "personas/completed": self.requested - self.failed,
               "personas/failed": self.failed, "personas/complete": float(not self.over_threshold)}
        out.update({f"personas/failed/{phase}": n for phase, n in self.reasons.items()})
        return out

    @property
    def over_threshold(self) -> bool:
        return self.requested > 0 and self.failed / self.requested > self.max_failed_fraction

    def status_line(self) -> str:
        """The last line the job prints (scripts read it)."""
        if not self.failed:
            return f"complete: {self.requested} of {self.requested} personas synthesised"
        reasons = ", ".join(f"{phase}={n}" for phase, n in sorted(self.reasons.items()))
        verdict = (f"above runtime.max_failed_fraction={self.max_failed_fraction:g}: exit 3" if self.over_threshold
                   else f"within runtime.max_failed_fraction={self.max_failed_fraction:g}")
        return f"INCOMPLETE: {self.failed} of {self.requested} personas failed (at {reasons}); {verdict}"


@dataclass
class SynthesisSummary:
    """A synthesis job's results: every persona's outcome in index order, the metrics, the completeness."""

    outcomes: list[PersonaOutcome]
    metrics: dict[str, float]
    completeness: Completeness
    instances_path: Path

    @property
    def n_units(self) -> int:
        return len(self.outcomes)

    @property
    def complete(self) -> bool:
        return not self.completeness.failed

    @property
    def over_threshold(self) -> bool:
        return self.completeness.over_threshold

    def status_line(self) -> str:
        return self.completeness.status_line()

    @property
    def headline(self) -> float:
        """The instances written (what a sweep over recipes would compare)."""
        return float(len(self.instances))

    @property
    def instances(self) -> list[dict]:
        return [r for o in self.outcomes for r in o.instances]


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
    if any(o.dropped for o in outcomes):
        why = "every instance was dropped (metrics.json lists why, per persona)"
    elif any(o.failed_phase for o in outcomes):
        why = "every persona failed before its instances were built (see 'failed' above)"
    else:
        why = "no persona produced an instance"
    return [f"no instances to evaluate ({instances_path.name} is empty): {why}; journeys/ keeps each persona's "
            "artefacts and every model reply (persona_NNN.calls.jsonl)"]
