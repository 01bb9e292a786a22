"""The configuration reference (docs/configuration.md), written from the schemas: ``python -m cupid_exp.reference``.
Each key's meaning is its field's comment, so the reference cannot drift from the code."""

from __future__ import annotations

import inspect
import io
import re
import tokenize
from dataclasses import MISSING as NO_DEFAULT
from dataclasses import Field, fields, is_dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import yaml

from cupid_exp.config import (
    CallsConfig,
    DataConfig,
    EvaluatorConfig,
    ModelConfig,
    RunConfig,
    RuntimeConfig,
    SettingConfig,
    TaskConfig,
    TrackingConfig,
)
from cupid_exp.synthesis.config import SynthesisConfig

CONF = Path(__file__).resolve().parents[1] / "conf"
ENTRY = CONF / "config.yaml"
COMMAND = "python -m cupid_exp.reference > docs/configuration.md"

#: (group or key prefix, schema, what it is): the sections, in the order a job composes them
SECTIONS = (
    ("model", ModelConfig, "the evaluated model; the same keys for every `llm` choice and role "
                           "(`evaluator.<role>`, `synthesis.roles.<role>`)"),
    ("evaluator", EvaluatorConfig, None),
    ("task", TaskConfig, None),
    ("data", DataConfig, None),
    ("runtime", RuntimeConfig, None),
    ("calls", CallsConfig, None),
    ("tracking", TrackingConfig, "where and what a job logs (MLflow)"),
    ("synthesis", SynthesisConfig, "the synthesis job's recipe (`python -m cupid_exp.synthesize`)"),
)
NO_SCHEMA = {"llm": "model configs to place in a role: `llm@evaluator.judge=gpt4o`",
             "experiment": "presets of the paper's tables (`+experiment=table1`; docs/presets.md)",
             "hydra": "Hydra's own settings (run folders, logging)",
             "local": "your machine's own defaults, git-ignored (`conf/local/default.yaml`)"}


@lru_cache(maxsize=None)
def field_comments(cls: type) -> dict[str, str]:
    """Field name -> its comment in ``cls``'s source, on one line (``#:`` and ``#`` both read)."""
    lines, _ = inspect.getsourcelines(cls)
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#:").strip()
    out = {}
    for number, line in enumerate(lines, 1):
        if found := re.match(r"    (\w+)\s*:", line):  # a field of the class body (not a method's line)
            name = found[1]
            text = comments.get(number)
            if text is None:  # the comment block just above the field
                above, k = [], number - 1
                while k in comments and lines[k - 1].strip().startswith("#"):
                    above.insert(0, comments[k])
                    k -= 1
                text = " ".join(above) or None
            if text:
                out.setdefault(name, text)
    return out


def _shown(value: object) -> str:
    if value == "???":
        return "set by the choice"
    return "`null`" if value is None else f"`{str(value).lower() if isinstance(value, bool) else value}`"


def _default(f: Field[object], chosen: dict) -> str:
    """The schema's default, or the default choice's value (``chosen``) where it gives one."""
    if f.name in chosen and not isinstance(chosen[f.name], (dict, list)):
        return _shown(chosen[f.name])
    if f.default is not NO_DEFAULT:
        return _shown(f.default)
    value = f.default_factory()
    return "see below" if is_dataclass(value) else _shown(value)


def _summary(cls: type) -> str:
    """The first sentence of a schema's own docstring (a dataclass without one gets its signature: none)."""
    doc = cls.__dict__.get("__doc__") or ""
    if doc.startswith(cls.__name__ + "("):
        return ""
    return " ".join(doc.replace("``", "`").split()).split(". ")[0].rstrip(".")


def rows(prefix: str, cls: type, chosen: dict | None = None) -> Iterator[tuple[str, str, str, str | None]]:
    """(key, type, default, meaning) of every field of ``cls`` under ``prefix``, nested schemas expanded."""
    for f in fields(cls):
        key, kind = f"{prefix}.{f.name}" if prefix else f.name, str(f.type)
        # the dataclass a field holds (``X`` or ``Optional[X]``), looked up in its schema's module
        inner = vars(inspect.getmodule(cls)).get(kind.removeprefix("Optional[").removesuffix("]"))
        inner = inner if isinstance(inner, type) and is_dataclass(inner) else None
        meaning = next((field_comments(k)[f.name] for k in cls.__mro__
                        if is_dataclass(k) and f.name in field_comments(k)), None)  # inherited fields too
        if inner is ModelConfig:  # a role: its own meaning, if any, then where its keys are
            meaning = f"{meaning + '; ' if meaning else ''}a model (`llm@{key}=<choice>`; its keys as under `model`)"
        yield key, kind, _default(f, chosen or {}), meaning
        if inner is not None and inner is not ModelConfig:
            yield from rows(key, inner)


def _choices(group: str) -> str:
    return ", ".join(f"`{p.stem}`" for p in sorted((CONF / group).glob("*.yaml")))


def sections() -> list[tuple[str, str, list[tuple[str, str, str, str | None]]]]:
    """(title, first line, rows) of every section of the reference, in its order."""
    defaults = yaml.safe_load(ENTRY.read_text(encoding="utf-8"))["defaults"]
    chosen_of = {str(k): str(v) for item in defaults if isinstance(item, dict) for k, v in item.items()}
    top = [r for r in rows("", RunConfig) if r[0] in ("seed", "prompts.dir", "paths.output_root")]
    out = [("Top level", "What every evaluation job has beside its groups (`prompts` and `paths` are the "
            "synthesis job's too).", top)]
    for group, cls, what in SECTIONS:
        doc = what or _summary(cls)
        chosen = CONF / group / f"{chosen_of.get(group, '-')}.yaml"
        values = (yaml.safe_load(chosen.read_text(encoding="utf-8")) if chosen.exists() else None) or {}
        default = f" (default: `{chosen_of[group]}`)" if group in chosen_of else ""
        out.append((f"`{group}`", f"{doc[0].upper()}{doc[1:]}. Choices: {_choices(group)}{default}.",
                    list(rows(group, cls, values))))
    out.append(("`setting`", f"What the model sees of an instance's history. Choices: {_choices('setting')} "
                f"(default: `{chosen_of['setting']}`); each setting's own keys follow.",
                list(rows("setting", SettingConfig))))
    from cupid_exp.settings import SETTINGS, _load_all

    _load_all()
    for name, cls in sorted((name, setting.Config) for name, setting in SETTINGS.items()):
        own = [r for r in rows("setting", cls) if r[0] != "setting.name"]
        if own:
            out.append((f"`setting={name}`", _summary(cls), own))
    return out


def missing_meanings() -> list[str]:
    """Keys whose schema field has no comment: each needs one line saying what it does."""
    return [key for _, _, found in sections() for key, _, _, meaning in found if not meaning]


def render() -> str:
    out = ["# Configuration reference", "",
           "Generated from the schemas (`cupid_exp/config.py`, `cupid_exp/synthesis/config.py`, the settings' "
           f"modules under `cupid_exp/settings/`) by `{COMMAND}`; `tests/test_reference.py` keeps it current. A key "
           "is set on the command line (`runtime.workers=2`) or in `conf/local/default.yaml`; a group by its choice "
           "(`model=gpt4o`: the YAML under `conf/<group>/`). A default is what the group's default choice gives, "
           "else the schema's; \"set by the choice\": each choice gives its own.", ""]
    bar = "|"
    for title, intro, found in sections():
        out += [f"## {title}", ""] + ([intro, ""] if intro else [])
        out += ["| key | type | default | meaning |", "|---|---|---|---|"]
        out += [f"| `{key}` | `{kind}` | {default} | {(meaning or '').replace(bar, chr(92) + bar)} |"
                for key, kind, default, meaning in found] + [""]
    out += ["## Groups without a schema of their own", ""]
    out += [f"- `{group}`: {what}. Choices: {_choices(group) or 'your own'}." for group, what in NO_SCHEMA.items()]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
