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


def test_a_slow_disk_never_holds_the_event_loop_and_the_last_save_lands(tmp_path, monkeypatch) -> None:
    """Every save of a journey file is fsynced; on the event loop each one stopped every other persona's calls while
    the disk flushed. Saved from a running loop, the text is taken at once and written by a thread; saves made
    meanwhile coalesce, and once flushed the file holds the last one."""
    import asyncio
    import os
    import time

    fsync, synced = os.fsync, []

    def slow_fsync(fd: int) -> None:
        time.sleep(0.3)
        synced.append(fd)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    t = TEMPLATES[0]

    async def steps() -> tuple[float, int]:
        store = JourneyStore.open(tmp_path, t, make_template(0, t.index), 0)  # a fresh file, saved
        began = time.perf_counter()
        for n in range(5):
            store.data["step"] = n
            store.save()
        held = time.perf_counter() - began
        ticks = 0
        for _ in range(10):  # the loop goes on while the disk flushes
            await asyncio.sleep(0.01)
            ticks += 1
        await store.writes.flushed()
        return held, ticks

    held, ticks = asyncio.run(steps())
    assert held < 0.2 and ticks == 10  # five saves took no disk time on the loop
    assert json.loads((tmp_path / "persona_001.json").read_text())["step"] == 4
    assert 1 <= len(synced) <= 3  # coalesced: not one fsync per save


def test_a_persona_file_of_garbage_is_set_aside_and_the_persona_starts_again(tmp_path, caplog) -> None:
    import logging

    import pytest

    t = TEMPLATES[0]
    path = tmp_path / "persona_001.json"
    garbage = b"\x00\x17not json\xff" * 30
    path.write_bytes(garbage)
    with pytest.raises(ValueError):  # the fault: it cannot be read
        json.loads(path.read_bytes())
    with caplog.at_level(logging.WARNING, logger="cupid_exp.aside"):
        store = JourneyStore.open(tmp_path, t, make_template(0, t.index), 0)
    (aside,) = tmp_path.glob("persona_001.json.corrupt-*")
    assert aside.read_bytes() == garbage and json.loads(path.read_text())["factor_plan"] == store.data["factor_plan"]
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"persona file {path} is unreadable") and "that persona starts again" in line
