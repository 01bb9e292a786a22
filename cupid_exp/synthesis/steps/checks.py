"""Text heuristics the synthesis validators share: content words, overlap, name keys, placeholders, English."""

from __future__ import annotations

import re

from cupid_exp.data.schema import normalize_text

_STOP = set("a an the and or but of to in on for with by at from as is are be that this these those it its "
            "their they them his her he she you your when whenever must should always never all any each every "
            "more most less than so very into about only also using use uses used".split())

_PLACEHOLDER = re.compile(r"<[A-Za-z][^<>\n]{1,40}>|^\.\.\.$")


# A tiny model at a hot retry now and then drifts into French or Spanish; the decomposer then cannot write
# English yes/no questions about the preference and the whole persona is lost, so
# such text is refused where it is written. Function words tell the languages apart without a model.
_ENGLISH = set("a an the and or of to in on for with by at from is are be that this it i my you your "
               "when what which who how should would wants want prefers prefer likes like not must".split())
_FOREIGN = set("le les des du et est une je ne pas pour avec dans sur qui nous vous votre el los las y con "
               "por para es una del der die das und ist nicht mit ein eine zu il di che per non sono".split())


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9']+", text.lower()) if len(w) > 2 and w not in _STOP}


def overlap(part: str, whole: str) -> float:
    """Share of ``part``'s content words that also occur in ``whole``."""
    words = content_words(part)
    return len(words & content_words(whole)) / len(words) if words else 0.0


def name_key(text: str) -> str:
    """Comparison key: letters and digits only, lower case ('The team,' == 'the team;')."""
    return re.sub(r"[^a-z0-9]+", "", text.lower())


def same_text(a: str, b: str) -> bool:
    """Equal once whitespace is collapsed and a trailing period dropped, ignoring case."""
    return normalize_text(a).lower() == normalize_text(b).lower()


def contains_text(whole: str, part: str) -> bool:
    """``part`` occurs in ``whole`` under the same normalisation as ``same_text``."""
    return normalize_text(part).lower() in normalize_text(whole).lower()


def placeholders(data: object) -> list[str]:
    """Strings copied from the prompt's example ('<one sentence>', '...') instead of written."""
    if isinstance(data, str):
        return _PLACEHOLDER.findall(data.strip())
    if isinstance(data, (dict, list)):
        return [p for v in (data.values() if isinstance(data, dict) else data) for p in placeholders(v)]
    return []


def looks_english(text: str) -> bool:
    """False for more foreign function words than English ones, or several accents: a drifted reply."""
    words = re.findall(r"[^\W\d_]+", text.lower())
    accented = sum(1 for ch in text if ch.isalpha() and not ch.isascii())
    if accented > max(3, len(text) // 20):
        return False
    foreign = sum(w in _FOREIGN for w in words)
    return foreign < 2 or foreign <= sum(w in _ENGLISH for w in words)
