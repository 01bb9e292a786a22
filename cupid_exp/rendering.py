"""Text rendering of sessions, checklists and few-shot blocks, byte for byte as the official tool lays them out."""

from __future__ import annotations

import json
from typing import Iterable, Mapping, Sequence

from cupid_exp.data.schema import PriorSession

SCORE_TO_LABEL = {1.0: "Fully Covered", 0.5: "Partially Covered", 0.0: "Not Covered"}


def _sessions(blocks: Iterable[str]) -> str:
    """Each block under its '### Session i' heading, '---' after each."""
    return "".join(f"### Session {i}\n\n{block}---\n\n" for i, block in enumerate(blocks, start=1)).strip()


def interaction_log(sessions: Sequence[PriorSession]) -> str:
    """Sessions as '### Session i' blocks of '#### User' / '#### AI Assistant' turns."""
    return _sessions("".join(f"#### {'User' if m.role == 'user' else 'AI Assistant'}\n\n{m.content}\n\n"
                             for m in session.dialogue) for session in sessions)


def numbered(items: Iterable[str]) -> str:
    return "\n".join(f"{i}. {item}" for i, item in enumerate(items, start=1))


def bulleted(items: Iterable[str]) -> str:
    return "\n".join(f"- {item}" for item in items)


def matcher_examples(examples: Sequence[Mapping]) -> str:
    """Few-shot block: each example's preference, then its labels as a fenced JSON 'results' list."""
    text = ""
    for example in examples:
        results = [
            {"index": i, "entry": entry, "label": SCORE_TO_LABEL.get(float(score), "Not Covered")}
            for i, (entry, score) in enumerate(example["checklist"].items(), start=1)
        ]
        text += f"#### Preference\n\n{example['preference']}\n\n#### Output\n\n```json\n"
        text += json.dumps({"results": results}, indent=2)
        text += "\n```\n\n---\n\n"
    return text.strip()


def summary_log(summaries: Sequence[Mapping]) -> str:
    """Summaries as per-session Context and Preferences lists (our rendering; 'analysis' dropped)."""
    return _sessions(f"#### Context\n\n{bulleted(s['context']) or '- (none)'}\n\n"
                     f"#### Preferences\n\n{bulleted(s['preferences']) or '- (none)'}\n\n" for s in summaries)
