"""Prompt files in the official tool's layout: <dir>/{evaluation,synthesis}/<name>.yaml. A drop-in directory is taken
whole: a file it lacks is never replaced by ours, and the plan refuses a job needing one. The official tool's eight
matcher examples are read from its ``evaluation/modules/preference_matcher.py`` beside ``prompts.dir``: only the
literal is evaluated (``ast``), so nothing of it runs and nothing is copied here."""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import yaml

from cupid_exp.errors import ConfigError
from cupid_exp.resources import prompts_dir

OFFICIAL_MATCHER_MODULE = "evaluation/modules/preference_matcher.py"  # relative to the prompts folder's parent
EXAMPLES_NAME = "EXAMPLES"
SCORES = (0, 0.5, 1)


def _literal(tree: ast.Module) -> object:
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == EXAMPLES_NAME for t in targets):
                return ast.literal_eval(node.value)
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


PROJECT_PROMPTS = prompts_dir()
MATCHER_EXAMPLES = "evaluation/preference_matcher_examples.yaml"
EVALUATION_PROMPTS = ("evaluation/", "synthesis/preference_decomposer.yaml")  # what an evaluation job reads


@dataclass(frozen=True)
class PromptTemplate:
    name: str
    system: str | None
    user: str

    def messages(self, system_role: str = "system", *, format_system: bool = True,
                 **values: object) -> list[dict[str, str]]:
        """Chat messages by ``str.format``; ``format_system=False`` sends the system text as written (as upstream)."""
        try:
            user = self.user.format(**values)
            system = self.system if self.system is None or not format_system else self.system.format(**values)
        except (KeyError, IndexError) as exc:
            raise KeyError(f"prompt {self.name} needs placeholder {exc} that this step does not provide") from exc
        out = [{"role": system_role, "content": system}] if system is not None else []
        return out + [{"role": "user", "content": user}]


class PromptSet:
    """Loads templates on first use, from this directory only: a missing file raises FileNotFoundError naming it."""

    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory).expanduser().resolve() if directory else PROJECT_PROMPTS
        if not self.directory.is_dir():
            raise FileNotFoundError(f"prompts.dir is not a directory: {self.directory}")
        self._cache: dict[str, PromptTemplate] = {}

    def _path(self, relative: str) -> Path:
        """The file for the digest: a drop-in's, or ours of the same name (earlier digests covered both)."""
        path = self.directory / relative
        return path if path.is_file() else PROJECT_PROMPTS / relative

    def missing(self, names: Iterable[str]) -> list[str]:
        """The files among ``names`` (like 'evaluation/preference_inferrer') that this directory lacks."""
        return [f"{name}.yaml" for name in names if not (self.directory / f"{name}.yaml").is_file()]

    def get(self, name: str) -> PromptTemplate:
        """``name`` like 'evaluation/preference_inferrer'."""
        if name not in self._cache:
            path = self.directory / f"{name}.yaml"
            if not path.is_file():
                raise FileNotFoundError(f"{self.directory} has no {name}.yaml")
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or "user_prompt" not in data and "system_prompt" not in data:
                raise ValueError(f"{path}: expected keys system_prompt and user_prompt")
            self._cache[name] = PromptTemplate(name, data.get("system_prompt"), data.get("user_prompt", ""))
        return self._cache[name]

    def _examples_source(self) -> Path | None:
        """Where the matcher's examples come from: ours, a drop-in's file, or the official module (None)."""
        own = self.directory / MATCHER_EXAMPLES
        if own.is_file():
            return own
        official = self.directory.parent / OFFICIAL_MATCHER_MODULE
        return official if official.is_file() else None

    def matcher_examples(self) -> list[dict]:
        """The few-shot pairs; a drop-in without its own raises ConfigError before any call."""
        source = self._examples_source()
        if source is None:
            raise ConfigError(f"prompts.dir={self.directory}: no matcher few-shot examples: expected "
                              f"{self.directory / MATCHER_EXAMPLES} or an {EXAMPLES_NAME} list in "
                              f"{self.directory.parent / OFFICIAL_MATCHER_MODULE} (the official checkout's layout)")
        if source.suffix == ".py":
            return read_official_examples(source)
        return list(yaml.safe_load(source.read_text(encoding="utf-8"))["examples"])

    def digest(self, prefixes: tuple[str, ...] | None = None) -> str:
        """Hash of the prompt files in effect (under ``prefixes``, or all), so runs with different prompts differ."""
        h = hashlib.sha256()
        names = {p.relative_to(PROJECT_PROMPTS).as_posix() for p in PROJECT_PROMPTS.rglob("*.yaml")}
        names |= {p.relative_to(self.directory).as_posix() for p in self.directory.rglob("*.yaml")}
        if prefixes is not None:
            names = {n for n in names if n.startswith(prefixes)}
        examples = self._examples_source()
        for name in sorted(names - {MATCHER_EXAMPLES}):
            h.update(name.encode() + b"\0" + self._path(name).read_bytes())
        if examples is not None and (prefixes is None or MATCHER_EXAMPLES.startswith(prefixes)):
            h.update(MATCHER_EXAMPLES.encode() + b"\0" + examples.read_bytes())
        return h.hexdigest()[:16]
