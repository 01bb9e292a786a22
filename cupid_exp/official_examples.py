"""The official tool's eight matcher examples, read at run time from its ``evaluation/modules/preference_matcher.py``
beside ``prompts.dir``: only the literal is evaluated (``ast``), so nothing of it runs and nothing is copied here."""

from __future__ import annotations

import ast
from pathlib import Path

from cupid_exp.errors import ConfigError

OFFICIAL_MATCHER_MODULE = "evaluation/modules/preference_matcher.py"  # relative to the prompts folder's parent
EXAMPLES_NAME = "EXAMPLES"
SCORES = (0, 0.5, 1)


def missing_examples(prompts_dir: Path, examples_file: str) -> ConfigError:
    return ConfigError(
        f"prompts.dir={prompts_dir}: no matcher few-shot examples: expected {prompts_dir / examples_file} or an "
        f"{EXAMPLES_NAME} list in {prompts_dir.parent / OFFICIAL_MATCHER_MODULE} (the official checkout's layout)")


def _literal(tree: ast.Module) -> object:
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == EXAMPLES_NAME for t in targets):
            return ast.literal_eval(value)
    raise LookupError(f"no module-level {EXAMPLES_NAME} = [...]")


def _check(examples: object) -> list[dict]:
    """Each example: a preference string and a checklist mapping entry -> 0 / 0.5 / 1."""
    if not isinstance(examples, list) or not examples:
        raise ValueError(f"{EXAMPLES_NAME} is not a non-empty list")
    for i, example in enumerate(examples, start=1):
        ok = (isinstance(example, dict) and isinstance(example.get("preference"), str)
              and isinstance(example.get("checklist"), dict) and example["checklist"]
              and all(isinstance(k, str) and v in SCORES for k, v in example["checklist"].items()))
        if not ok:
            raise ValueError(f"example {i} is not {{'preference': str, 'checklist': {{entry: 0 | 0.5 | 1}}}}")
    return examples


def read_official_examples(module: Path) -> list[dict]:
    """The ``EXAMPLES`` literal of the official matcher module, checked; ConfigError (one line) otherwise."""
    try:
        return _check(_literal(ast.parse(module.read_text(encoding="utf-8"), filename=str(module))))
    except (OSError, SyntaxError, ValueError, LookupError) as exc:
        raise ConfigError(f"cannot read the matcher few-shot examples from {module}: {exc}") from None
