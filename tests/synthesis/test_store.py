"""Journey files: a rerun resumes its own file; one written for another template starts over."""

from __future__ import annotations

import json

from cupid_exp.synthesis.journey import make_template
from cupid_exp.synthesis.personas import builtin_seeds, sample_templates
from cupid_exp.synthesis.store import JourneyStore

TEMPLATES = sample_templates(2, 0, builtin_seeds(2, 0))


def test_resumes_its_own_file_and_restarts_another_templates(tmp_path) -> None:
    t = TEMPLATES[0]
    store = JourneyStore.open(tmp_path, t, make_template(0, t.index), 0)
    assert store.path.name == "persona_001.json" and json.loads(store.path.read_text())["factor_plan"]
    store.data["persona"] = {"description": "kept"}
    store.save()
    assert JourneyStore.open(tmp_path, t, make_template(0, t.index), 0).data["persona"] == {"description": "kept"}
    other = JourneyStore.open(tmp_path, t, make_template(1, t.index), 1)  # another seed: another journey
    assert "persona" not in other.data and "persona" not in json.loads(store.path.read_text())


def test_finished_needs_validation_only_when_the_recipe_asks_for_it(tmp_path) -> None:
    t = TEMPLATES[1]
    store = JourneyStore.open(tmp_path, t, make_template(0, t.index), 0)
    assert not store.finished(validate=False)
    store.data["status"] = "done"
    assert store.finished(validate=False) and not store.finished(validate=True)
    store.data["validation"] = []
    assert store.finished(validate=True)
