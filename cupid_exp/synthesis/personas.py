"""Persona templates: seeded, balanced attribute sampling (paper B.1, Table 5) and seed descriptions."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

from cupid_exp.synthesis import taxonomy
from cupid_exp.synthesis.config import SynthesisError


@dataclass(frozen=True)
class PersonaTemplate:
    index: int  # 1-based; the persona id's number
    seed_description: str
    career_level: str
    personality_traits: tuple[str, str]
    personal_values: tuple[str, str]
    decision_making_style: str

    @property
    def key(self) -> str:
        """The persona's key in the job's journal (and its journey file's name)."""
        return f"persona_{self.index:03d}"


class BalancedSampler:
    """Draws k options from the least-used (seeded ties), so counts stay within one or two (upstream's drift)."""

    def __init__(self, options: Sequence[str], rng: random.Random):
        self.options, self.rng = list(options), rng
        self.counts: Counter[str] = Counter({o: 0 for o in options})

    def draw(self, k: int, allowed: Callable[[list[str]], bool] = lambda _: True) -> list[str]:
        order = self.options[:]
        self.rng.shuffle(order)
        order.sort(key=lambda o: self.counts[o])  # stable: shuffled within a usage level
        for size in range(k, len(order) + 1):
            pool = order[:size]  # the `size` least-used options
            for _ in range(20):
                choice = self.rng.sample(pool, k)
                if allowed(choice):
                    self.counts.update(choice)
                    return choice
        raise ValueError("no allowed combination of options")


def _distinct_traits(choice: list[str]) -> bool:
    return len({taxonomy.trait_name(t) for t in choice}) == len(choice)


def sample_templates(n: int, seed: int, seeds: Sequence[str]) -> list[PersonaTemplate]:
    """``n`` persona templates; template i depends only on (seed, i), so a larger n tops up."""
    rng = random.Random(f"{seed}/personas")
    career = BalancedSampler(taxonomy.CAREER_LEVELS, rng)
    traits = BalancedSampler(taxonomy.PERSONALITY_TRAITS, rng)
    values = BalancedSampler(taxonomy.PERSONAL_VALUES, rng)
    styles = BalancedSampler(taxonomy.DECISION_STYLES, rng)
    return [PersonaTemplate(index=i + 1, seed_description=seeds[i % len(seeds)], career_level=career.draw(1)[0],
                            personality_traits=tuple(traits.draw(2, _distinct_traits)),  # type: ignore[arg-type]
                            personal_values=tuple(values.draw(2)),  # type: ignore[arg-type]
                            decision_making_style=styles.draw(1)[0]) for i in range(n)]


def builtin_seeds(n: int, seed: int) -> list[str]:
    """The shipped seed list in a seeded order (distinct occupations until the list runs out)."""
    order = list(taxonomy.SEED_DESCRIPTIONS)
    random.Random(f"{seed}/seeds").shuffle(order)
    return order


def personahub_seeds(n: int, seed: int, name: str, subset: str, split: str, text_field: str) -> list[str]:
    """``n`` distinct PersonaHub descriptions drawn with the seed (needs the Hugging Face Hub)."""
    try:
        import datasets

        ds = datasets.load_dataset(name, subset, split=split)
        rng = random.Random(f"{seed}/personahub")
        idx = rng.sample(range(len(ds)), min(n, len(ds)))
        return [str(ds[i][text_field]).strip() for i in idx]
    except Exception as exc:  # offline, gated, renamed: one clear line instead of a traceback
        reason = " ".join(str(exc).split())[:200]
        raise SynthesisError(f"synthesis.persona_source=personahub could not load {name} ({subset}/{split}) from "
                             f"the Hugging Face Hub: {type(exc).__name__}: {reason}. "
                             f"Offline, use synthesis.persona_source=builtin.") from exc


def render_template(t: PersonaTemplate) -> str:
    """One numbered line per template, as the persona writer's ``{seed_descriptions}``."""
    return (f"1. {t.seed_description}. Career level: {t.career_level}. "
            f"Personality traits: {', '.join(t.personality_traits)}. "
            f"Personal values: {', '.join(t.personal_values)}. "
            f"Decision-making style: {t.decision_making_style}.")
