"""Persona templates: seeded, balanced attributes from the paper's Table 5 only; seed descriptions."""

from __future__ import annotations

from collections import Counter

import pytest

from cupid_exp.synthesis import taxonomy
from cupid_exp.synthesis.config import SynthesisError
from cupid_exp.synthesis.personas import builtin_seeds, personahub_seeds, sample_templates
from cupid_exp.synthesis.taxonomy import SEED_DESCRIPTIONS


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_attributes_are_balanced_and_valid(seed: int) -> None:
    n = 60
    ts = sample_templates(n, seed, builtin_seeds(n, seed))
    for counts, options, per, spread in (
        (Counter(t.career_level for t in ts), taxonomy.CAREER_LEVELS, 1, 1),
        (Counter(t.decision_making_style for t in ts), taxonomy.DECISION_STYLES, 1, 1),
        (Counter(v for t in ts for v in t.personal_values), taxonomy.PERSONAL_VALUES, 2, 1),
        # two levels of one trait never go together, which can force a slightly less used pair
        (Counter(v for t in ts for v in t.personality_traits), taxonomy.PERSONALITY_TRAITS, 2, 2),
    ):
        assert set(counts) == set(options)
        assert sum(counts.values()) == n * per
        assert max(counts.values()) - min(counts.values()) <= spread, counts
    for t in ts:
        assert len(set(t.personal_values)) == 2
        traits = [taxonomy.trait_name(x) for x in t.personality_traits]
        assert len(set(traits)) == 2, "never two levels of one trait"
        assert all(x in taxonomy.BIG_FIVE_TRAITS for x in traits)
    assert "Extroversion" not in " ".join(taxonomy.PERSONALITY_TRAITS)  # the paper's four traits only


def test_templates_are_seeded_and_top_up() -> None:
    a = sample_templates(10, 3, builtin_seeds(10, 3))
    assert a == sample_templates(10, 3, builtin_seeds(10, 3))
    assert a != sample_templates(10, 4, builtin_seeds(10, 4))
    assert sample_templates(14, 3, builtin_seeds(14, 3))[:10] == a  # more personas keep the first ones
    assert [t.index for t in a] == list(range(1, 11))


def test_builtin_seeds_are_distinct_until_the_list_runs_out() -> None:
    assert len(SEED_DESCRIPTIONS) >= 40 and len(set(SEED_DESCRIPTIONS)) == len(SEED_DESCRIPTIONS)
    ts = sample_templates(len(SEED_DESCRIPTIONS), 0, builtin_seeds(0, 0))
    assert len({t.seed_description for t in ts}) == len(SEED_DESCRIPTIONS)


def test_personahub_offline_fails_with_one_clear_line(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(SynthesisError) as err:
        personahub_seeds(2, 0, "proj-persona/PersonaHub", "instruction", "train", "input persona")
    message = str(err.value)
    assert "\n" not in message and "persona_source=builtin" in message and "PersonaHub" in message
