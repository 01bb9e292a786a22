"""docs/configuration.md is what ``python -m cupid_exp.reference`` writes from the schemas, and every key in it says
what it does: a key added to a schema without a comment, or a reference left stale, fails here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from helpers.cli_runner import PROJECT_ROOT

from cupid_exp import reference
from cupid_exp.config import RuntimeConfig


def test_the_reference_in_docs_is_current() -> None:
    written = (PROJECT_ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert written == reference.render(), f"docs/configuration.md is stale: run `{reference.COMMAND}`"


def test_every_key_has_a_one_line_meaning() -> None:
    assert not reference.missing_meanings(), "give each of these keys a comment on its schema field: " + ", ".join(
        reference.missing_meanings())


def test_every_runtime_key_is_in_the_reference() -> None:
    keys = {key for _, _, found in reference.sections() for key, *_ in found}
    missing = {f"runtime.{name}" for name in RuntimeConfig.__dataclass_fields__} - keys
    assert not missing, missing
    assert "| `calls.timeout` | `float` | `600` |" in reference.render()


@dataclass
class _Example:
    said: int = 1  # on its line
    # above it,
    # on two lines
    above: Optional[str] = None
    silent: bool = False


def test_a_field_without_a_comment_has_no_meaning() -> None:
    assert reference.field_comments(_Example) == {"said": "on its line", "above": "above it, on two lines"}
    assert [r[3] for r in reference.rows("x", _Example)] == ["on its line", "above it, on two lines", None]
