"""Text heuristics the synthesis validators share: content words, overlap, name keys, placeholders."""

from __future__ import annotations

import re
from typing import Any

from cupid_exp.data.schema import normalize_text

_STOP = set("a an the and or but of to in on for with by at from as is are be that this these those it its "
            "their they them his her he she you your when whenever must should always never all any each every "
            "more most less than so very into about only also using use uses used".split())

_PLACEHOLDER = re.compile(r"<[A-Za-z][^<>\n]{1,40}>|^\.\.\.$")


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


def placeholders(data: Any) -> list[str]:
    """Strings copied from the prompt's example ('<one sentence>', '...') instead of written."""
    if isinstance(data, str):
        return _PLACEHOLDER.findall(data.strip())
    if isinstance(data, dict):
        return [p for v in data.values() for p in placeholders(v)]
    if isinstance(data, list):
        return [p for v in data for p in placeholders(v)]
    return []
