"""One persona's journey file, rewritten atomically after every step: what resume reads."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from cupid_exp.synthesis.files import FileWrites
from cupid_exp.synthesis.journey import JourneyTemplate, plan_factors
from cupid_exp.synthesis.personas import PersonaTemplate

log = logging.getLogger(__name__)


class JourneyStore:
    """One persona's journey file; every ``save`` replaces it atomically."""

    def __init__(self, path: Path, data: dict[str, Any]):
        self.path, self.data = path, data
        self.writes = FileWrites()  #: this persona's files, written off the event loop

    @classmethod
    def open(cls, directory: Path, template: PersonaTemplate, journey: JourneyTemplate, seed: int) -> "JourneyStore":
        """The persona's file as left, or a fresh one if written for another template (compared as JSON)."""
        path = directory / f"{template.key}.json"
        fresh = json.loads(json.dumps({"persona_index": template.index, "template": template.to_dict(),
                                       "journey": journey.to_dict(),
                                       "factor_plan": plan_factors(seed, template.index)}))
        data = cls._readable(path)
        if data is not None:
            if all(data.get(k) == fresh[k] for k in ("template", "journey", "factor_plan")):
                return cls(path, data)
            log.warning("%s was written for another template; starting that persona again", path)
        store = cls(path, fresh)
        store.save()
        return store

    @staticmethod
    def _readable(path: Path) -> dict[str, Any] | None:
        """The file as data; an unreadable one is set aside and the persona starts again."""
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError(f"a JSON {type(data).__name__}")
        except ValueError as exc:
            from cupid_exp.aside import set_aside

            set_aside(path, "persona file", exc, "that persona starts again (the response cache answers what it "
                      "asked already)")
            return None
        return data

    @classmethod
    def read(cls, directory: Path, template: PersonaTemplate) -> "JourneyStore | None":
        """The persona's file as it stands, or None where there is none (or it cannot be read)."""
        path = directory / f"{template.key}.json"
        try:
            return cls(path, json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return None

    def save(self) -> None:
        """The file as the data is now (the text is taken here; written at once outside an event loop)."""
        self.writes.replace(self.path, json.dumps(self.data, indent=2, ensure_ascii=False) + "\n")

    def finished(self, validate: bool) -> bool:
        return self.data.get("status") == "done" and (self.data.get("validation") is not None or not validate)
