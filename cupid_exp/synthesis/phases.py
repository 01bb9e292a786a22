"""One persona through its phases, each saved as done; a ``StepFailed`` fails the persona, a bug the job."""

from __future__ import annotations

import asyncio
import logging
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from cupid_exp.data.schema import DataError, validate_row
from cupid_exp.llm import calls
from cupid_exp.llm.limits import first_in_line, in_turn
from cupid_exp.llm.steps import StepFailed
from cupid_exp.synthesis import steps
from cupid_exp.synthesis.config import SynthesisConfig
from cupid_exp.synthesis.journey import (
    CHANGED,
    N_SESSIONS,
    JourneyTemplate,
    build_instances,
    persona_id,
    removed_sessions,
    session_task_type,
    slot_preference,
)
from cupid_exp.synthesis.personas import PersonaTemplate, render_template
from cupid_exp.synthesis.store import AttemptLog, JourneyStore

if TYPE_CHECKING:
    from cupid_exp.tracking.traces import TraceRoot

log = logging.getLogger(__name__)


@dataclass
class PersonaOutcome:
    """A persona's run (the unit of a synthesis job): its journey file's content and what it yielded."""

    index: int
    journey: dict[str, Any]
    failed_phase: str | None = None
    error: str | None = None
    instances: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, str]] = field(default_factory=list)
    validation: list[dict[str, Any]] = field(default_factory=list)
    failed_kind: str | None = None  #: the failed step's kind (provider, unparseable, ...)

    @classmethod
    def from_store(cls, index: int, store: JourneyStore) -> "PersonaOutcome":
        """A persona as its journey file holds it (finished by an earlier run, or failed there)."""
        j = store.data
        return cls(index=index, journey=j, failed_phase=j.get("failed_phase"), error=j.get("error"),
                   instances=j.get("instances") or [], dropped=j.get("dropped_instances", []),
                   validation=j.get("validation") or [], failed_kind=j.get("failed_kind"))

    @property
    def key(self) -> str:
        return f"persona_{self.index:03d}"

    def to_record(self) -> dict[str, Any]:
        """The persona's journal line; its artefacts are its journey file's."""
        errors = ([{"step": self.failed_phase, "kind": self.failed_kind or "failed", "message": self.error or ""}]
                  if self.failed_phase else [])
        persona = self.journey.get("persona") or {}
        return {"key": self.key, "index": self.index, "persona_id": persona.get("persona_id"),
                "status": "failed" if self.failed_phase else "done", "errors": errors,
                "instances": len(self.instances), "dropped": len(self.dropped)}

    def trace_root(self) -> TraceRoot:
        """The persona's trace: its template in, what it made out, a failed phase as the trace's error."""
        from cupid_exp.tracking.traces import TraceRoot

        persona = self.journey.get("persona") or {}
        record = self.to_record()
        return TraceRoot(
            name=self.key, inputs=dict(self.journey.get("template") or {}),
            outputs={"persona_id": persona.get("persona_id"), "description": persona.get("description"),
                     "status": record["status"], "instances": len(self.instances),
                     "instance_types": [r["instance_type"] for r in self.instances], "dropped": self.dropped,
                     "failed_phase": self.failed_phase, "error": self.error},
            attributes={"cupid.persona_index": self.index, "cupid.persona_id": persona.get("persona_id")},
            tags={"cupid.status": record["status"]},
            errors=[(e["kind"], e["message"], e["step"]) for e in record["errors"]])


def filter_unsatisfied(rows: list[dict[str, Any]], journey: JourneyTemplate, dialogues: list[dict[str, Any]],
                       policy: str) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """``keep``: every row; else drop a row with an unsatisfied prior session."""
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


class PhaseFailed(Exception):
    """A step of a phase run beside others failed (``in_phases``): the phase, and the step's ``StepFailed``."""

    def __init__(self, phase: str, failure: StepFailed):
        super().__init__(str(failure))
        self.phase, self.failure = phase, failure


async def in_phases(work: list[tuple[str, Any]]) -> None:
    """Run all; once all finished, raise a bug first, else the first failed step as ``PhaseFailed``."""
    results = await asyncio.gather(*(coro for _, coro in work), return_exceptions=True)
    failures = [(phase, r) for (phase, _), r in zip(work, results, strict=False) if isinstance(r, BaseException)]
    for _, r in failures:
        if not isinstance(r, StepFailed):
            raise r
    if failures:
        phase, first = failures[0]
        raise PhaseFailed(phase, first) from first


class PersonaRun:
    """The phases of one persona over its journey file; each phase skips what the file already holds."""

    def __init__(self, ctx: steps.SynthContext, scfg: SynthesisConfig, template: PersonaTemplate,
                 store: JourneyStore):
        self.ctx, self.scfg, self.template, self.store = ctx, scfg, template, store
        self.j = store.data
        self.journey = JourneyTemplate.from_dict(self.j["journey"])
        self.attempts = AttemptLog(store.path.with_suffix(".calls.jsonl"), None, store.writes)
        self._checklists: dict[str, asyncio.Task] = {}  #: each preference's checklist, started once

    def save(self, key: str, value: object) -> None:
        self.j[key] = value
        self.persist()

    def persist(self) -> None:
        """The journey file, and the replies received since the last save."""
        self.store.save()
        self.attempts.flush()

    async def persona(self) -> None:
        if "persona" not in self.j:
            persona = await steps.write_persona(self.ctx, render_template(self.template))
            self.save("persona", {**persona, "persona_id": persona_id(self.template.index, persona["occupation"])})

    async def factors(self) -> None:
        if "factors" not in self.j:
            def written(partial: list[dict[str, Any]]) -> None:
                self.save("factors_partial", partial)
                self.start_checklists(f["preference"] for f in partial)

            self.start_checklists(f["preference"] for f in self.j.get("factors_partial") or [])
            factors = await steps.write_factors(self.ctx, self.description, self.j["factor_plan"],
                                                done=self.j.get("factors_partial"), on_factor=written)
            self.start_checklists(f["preference"] for f in factors)  # the pair's second is not reported as partial
            self.j.pop("factors_partial", None)
            self.save("factors", factors)

    async def changed_preference(self) -> None:
        if "changed" not in self.j:
            factors = self.j["factors"]
            others = [f["preference"] for f in factors]
            self.save("changed", await steps.write_changed_preference(
                self.ctx, self.description, factors[self.journey.current_factor], others))

    def start_checklists(self, preferences: Iterable[str]) -> None:
        """Start each preference's checklist once, beside the chain, so idle slots have work."""
        for preference in preferences:
            if preference not in self._checklists:
                with in_turn():
                    self._checklists[preference] = asyncio.create_task(self.checklist(preference))

    async def checklist(self, preference: str) -> None:
        checklists = self.j.setdefault("checklists", {})
        if preference not in checklists:
            checklists[preference] = await steps.decompose(self.ctx, preference)
            self.persist()

    async def settle_checklists(self, cancel: bool) -> None:
        """Let the checklists finish and be saved (or cancel them); a bug among them raises, a step failure does not."""
        if cancel:
            for task in self._checklists.values():
                task.cancel()
        results = await asyncio.gather(*self._checklists.values(), return_exceptions=True)
        for result in results:
            if not cancel and isinstance(result, BaseException) and not isinstance(result, StepFailed):
                raise result

    async def sessions_checklists_dialogues(self) -> None:
        """Sessions in order, with checklists and dialogues as soon as their inputs exist; a failure lets the others
        finish and fails the persona at the earliest phase."""
        sessions = self.j.setdefault("sessions", [None] * N_SESSIONS)
        checklists = self.j.setdefault("checklists", {})
        self.j.setdefault("dialogues", [None] * (N_SESSIONS - 1))
        needed = list(dict.fromkeys([f["preference"] for f in self.j["factors"]] + [self.changed]))
        written = [asyncio.Event() for _ in range(N_SESSIONS)]  # set once the session exists, or never will
        listed = {preference: asyncio.Event() for preference in needed}

        async def write_sessions() -> None:
            try:
                with first_in_line():  # the persona's critical path: its calls go before the dialogues waiting
                    await self.sessions(written)
            finally:
                for event in written:
                    event.set()

        self.start_checklists(needed)

        async def checklist(preference: str) -> None:
            try:
                await self._checklists[preference]
            finally:
                listed[preference].set()

        async def dialogue(slot_index: int) -> None:
            preference = slot_preference(self.journey.slots[slot_index], self.j["factors"], self.changed)
            await written[slot_index].wait()
            await listed[preference].wait()
            if sessions[slot_index] is not None and preference in checklists:  # else what it needs failed
                await self.dialogue(slot_index, preference)

        await in_phases([("sessions", write_sessions())] + [("checklists", checklist(p)) for p in needed]
                        + [("dialogues", dialogue(i)) for i in range(N_SESSIONS - 1)])

    async def sessions(self, written: list[asyncio.Event]) -> None:
        factors, changed, sessions = self.j["factors"], self.changed, self.j["sessions"]
        first_changed = min(self.journey.positions(CHANGED))
        for slot in self.journey.slots:
            if sessions[slot.index] is None:
                factor = factors[slot.factor]
                preference = slot_preference(slot, factors, changed)
                session = await steps.write_session(
                    self.ctx, persona_description=self.description, factor=factor, preference=preference,
                    session_number=slot.index + 1, n_sessions=N_SESSIONS, earlier=sessions[: slot.index],
                    task_type=session_task_type(self.scfg.seed, self.template.index, slot.index, factor["task_types"]),
                    shift_reason=self.j["changed"]["reason"] if slot.index == first_changed else None)
                sessions[slot.index] = {**session, "context_factor": factor["factor"], "preference": preference,
                                        "kind": slot.kind}
                self.persist()
            written[slot.index].set()

    async def dialogue(self, slot_index: int, preference: str) -> None:
        factors, sessions, dialogues = self.j["factors"], self.j["sessions"], self.j["dialogues"]
        slot = self.journey.slots[slot_index]
        record = dialogues[slot_index]
        while record is None or (self.scfg.on_unsatisfied == "regenerate" and not record["is_satisfied"]
                                 and record["attempt"] < self.scfg.max_retries):
            record = await steps.simulate_dialogue(
                self.ctx, persona_description=self.description, factor=factors[slot.factor]["factor"],
                preference=preference, checklist=self.j["checklists"][preference],
                request=steps.first_message(sessions[slot_index]),
                attempt=0 if record is None else record["attempt"] + 1)
            dialogues[slot_index] = record
            self.persist()

    def instances(self, outcome: PersonaOutcome) -> None:
        """The three rows (paper B.5), minus those the unsatisfied policy or the data schema rejects."""
        j = self.j
        rows = build_instances(j["persona"]["persona_id"], self.journey, j["factors"], self.changed, j["checklists"],
                               j["sessions"], [d["dialogue"] for d in j["dialogues"]])
        kept, outcome.dropped = filter_unsatisfied(rows, self.journey, j["dialogues"], self.scfg.on_unsatisfied)
        for row in kept:
            try:
                validate_row(row, f"persona {self.template.index}")
                outcome.instances.append(row)
            except DataError as exc:
                outcome.dropped.append({"persona_id": row["persona_id"], "instance_type": row["instance_type"],
                                        "reason": str(exc)})
        j["instances"], j["dropped_instances"] = outcome.instances, outcome.dropped
        self.persist()

    async def validation(self, outcome: PersonaOutcome) -> None:
        if "validation" not in self.j:
            j = self.j
            self.save("validation", await steps.validate_persona(self.ctx, self.journey, j["factors"], self.changed,
                                                                 j["checklists"], j["dialogues"], outcome.instances))
        outcome.validation = self.j["validation"]

    @property
    def description(self) -> str:
        return self.j["persona"]["description"]

    @property
    def changed(self) -> str:
        return self.j["changed"]["preference"]

    async def run(self) -> PersonaOutcome:
        # the job's log of this persona's calls when it keeps one (its trace), else one of its own
        current = calls.current()
        with (nullcontext(current) if current is not None else calls.recording()) as log:
            self.attempts.log = log
            try:
                return await self._run()
            finally:
                self.attempts.flush()
                await self.store.writes.flushed()  # its files hold all it did before it counts as finished

    async def _run(self) -> PersonaOutcome:
        outcome = PersonaOutcome(index=self.template.index, journey=self.j)
        chain = [("persona", self.persona), ("factors", self.factors), ("changed_preference", self.changed_preference)]
        phase = "persona"
        try:
            try:
                with first_in_line():  # one call at a time, each the persona's next: it goes before calls that can wait
                    for phase, step in chain:  # noqa: B007 - the except below names the phase that failed
                        await step()
            except BaseException as stopped:
                await self.settle_checklists(cancel=not isinstance(stopped, StepFailed))
                raise
            phase = "sessions"
            await self.sessions_checklists_dialogues()
            phase = "instances"
            self.instances(outcome)
            phase = "validation"
            if self.scfg.validate:
                await self.validation(outcome)
        except (StepFailed, PhaseFailed) as caught:
            if isinstance(caught, PhaseFailed):  # which of the phases run side by side
                phase, caught = caught.phase, caught.failure
            outcome.failed_phase, outcome.error, outcome.failed_kind = phase, str(caught), caught.kind
            log.warning("persona %d failed at %s: %s", self.template.index, phase, caught)
        self.j.update(status="failed" if outcome.failed_phase else "done", failed_phase=outcome.failed_phase,
                      error=outcome.error, failed_kind=outcome.failed_kind)
        self.persist()
        return outcome


async def synthesize_persona(ctx: steps.SynthContext, scfg: SynthesisConfig, template: PersonaTemplate,
                             store: JourneyStore) -> PersonaOutcome:
    """One persona, resumed from its journey file; a finished one is returned as it is."""
    if store.finished(scfg.validate):
        return PersonaOutcome.from_store(template.index, store)
    return await PersonaRun(ctx, scfg, template, store).run()
