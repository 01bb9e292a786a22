"""What changed between two runs (MLflow run ids or job folders), as Hydra overrides: ``python -m cupid_exp.diff A B``.
Each side is read from a job folder or an MLflow run (``RunSpec``); appended to A's overrides, the diff composes B's
resolved config, which is checked against the current ``conf/`` (as ``python -m cupid_exp`` would compose it, in
Hydra's override grammar); redacted values are never compared."""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml
from hydra.core.override_parser.types import Quote, QuotedString
from omegaconf import DictConfig, OmegaConf

from cupid_exp.reporting.runs import DEFAULT_TRACKING_URI, is_run_id_prefix, resolve_run_id, tracking_uri
from cupid_exp.secrets import MASK, redact

DIGESTS = ("prompts_digest", "dataset_digest", "git_commit")
ABSENT = object()  # what ``RunSpec.select`` gives for a key the record does not have


@dataclass
class RunSpec:
    """One side of a diff: what a run was composed from and what it resolved to."""

    label: str
    config: dict[str, Any]  # resolved (where resolvable), secrets redacted, no 'hydra' key
    choices: dict[str, str]  # config group -> option (Hydra's runtime.choices), hydra/* left out
    overrides: list[str] | None  # the task overrides it was launched with; None when unknown
    digests: dict[str, str] = field(default_factory=dict)

    @functools.cached_property
    def _tree(self) -> DictConfig:
        return OmegaConf.create(self.config)

    def select(self, key: str) -> object:
        """The recorded value at dotted ``key`` as plain data; ``ABSENT`` when the record lacks it."""
        value = OmegaConf.select(self._tree, key, default=ABSENT, throw_on_resolution_failure=False)
        return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def job_choices(raw: Mapping[str, Any] | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (raw or {}).items() if v is not None and not str(k).startswith("hydra/")}


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """Resolve interpolations where possible; a top-level node that cannot be resolved stays as written."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:
        raw = OmegaConf.to_container(cfg, resolve=False)
        out = {}
        for key in cfg:
            try:
                node = cfg[key]
                out[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
            except Exception:
                out[key] = raw[key]
        return out


def _read_overrides(path: Path) -> list[str] | None:
    return [str(o) for o in (yaml.safe_load(path.read_text()) or [])] if path.exists() else None


def spec_from_job_dir(path: str | Path) -> RunSpec:
    """A Hydra job output dir: .hydra/config.yaml, .hydra/hydra.yaml, .hydra/overrides.yaml (+ metrics.json)."""
    path = Path(path)
    hydra_dir = path / ".hydra"
    if not (hydra_dir / "config.yaml").exists():
        raise FileNotFoundError(f"{path} is not a Hydra job dir (no .hydra/config.yaml)")
    cfg = OmegaConf.load(hydra_dir / "config.yaml")
    config = redact({k: v for k, v in resolved(cfg).items() if k != "hydra"})
    choices: dict[str, str] = {}
    if (hydra_dir / "hydra.yaml").exists():
        raw = OmegaConf.select(OmegaConf.load(hydra_dir / "hydra.yaml"), "hydra.runtime.choices")
        choices = job_choices(OmegaConf.to_container(raw) if raw is not None else None)
    digests = {}
    metrics = path / "metrics.json"
    if metrics.exists():
        summary = json.loads(metrics.read_text())
        git = summary.get("git") or {}  # resources.git_state(): git_commit, git_dirty
        digests = {"prompts_digest": summary.get("prompts_digest"),
                   "dataset_digest": (summary.get("data") or {}).get("digest"),
                   "git_commit": summary.get("git_commit") or git.get("git_commit") or git.get("commit")}
        digests = {k: str(v) for k, v in digests.items() if v}
        if git.get("git_dirty") == "true" and "git_commit" in digests:  # as an MLflow run's tags say it
            digests["git_commit"] += " (dirty)"
    return RunSpec(f"job dir {path}", config, choices, _read_overrides(hydra_dir / "overrides.yaml"), digests)


def spec_from_mlflow(run_id: str, tracking_uri: str) -> RunSpec:
    """An MLflow job run: the config.yaml artifact, params choice.<group>, tags for the digests."""
    import mlflow.artifacts
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    run = MlflowClient(tracking_uri).get_run(run_id)
    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="config.yaml", dst_path=tmp,
                                                    tracking_uri=tracking_uri)
        config = yaml.safe_load(Path(local).read_text(encoding="utf-8")) or {}
    # the tracker writes 'choice.' + the group with characters outside [\w.\-/: ] (the '@') turned into ':'
    choices = job_choices({k.removeprefix("choice.").replace(":", "@"): v
                           for k, v in run.data.params.items() if k.startswith("choice.")})
    out_dir = run.data.tags.get("output_dir")
    overrides = _read_overrides(Path(out_dir) / ".hydra" / "overrides.yaml") if out_dir else None
    digests = {k: run.data.tags[k] for k in DIGESTS if run.data.tags.get(k)}
    if run.data.tags.get("git_dirty") == "true" and "git_commit" in digests:
        digests["git_commit"] += " (dirty)"
    return RunSpec(f"MLflow run {run_id}", redact(config), choices, overrides, digests)


def load_spec(ref: str, tracking_uri: str) -> RunSpec:
    """A job output dir, or an MLflow run by its id or the start of it when unique (RunIdError otherwise)."""
    if Path(ref).is_dir():
        return spec_from_job_dir(ref)
    if is_run_id_prefix(ref):
        return spec_from_mlflow(resolve_run_id(tracking_uri, ref), tracking_uri)
    raise ValueError(f"{ref!r} is neither a job output dir nor an MLflow run id (or the start of one: hex digits)")


_UNQUOTED = re.compile(r"^[A-Za-z_/][\w\-./@:+]*$")
_KEYWORDS = {"true", "false", "null", "none", "nan", "inf", "-inf", "+inf"}


@dataclass
class Composed:
    resolved: dict[str, Any]
    unresolved: DictConfig
    choices: dict[str, str]

    def derived(self, key: str) -> bool:
        """True when the value at dotted ``key`` follows from another by interpolation."""
        parent, _, leaf = key.rpartition(".")
        try:
            node = OmegaConf.select(self.unresolved, parent) if parent else self.unresolved
            return isinstance(node, DictConfig) and OmegaConf.is_interpolation(node, leaf)
        except Exception:  # a parent that cannot be resolved: treat the key as a source
            return False


def compose(overrides: Sequence[str]) -> Composed:
    """Compose ``conf/config.yaml`` with ``overrides`` as ``python -m cupid_exp`` would (no hydra key)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from cupid_exp.config_store import register_configs
    from cupid_exp.resources import conf_dir

    register_configs()
    GlobalHydra.instance().clear()  # a no-op unless initialized (e.g. when called from inside a Hydra app)
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
    choices = job_choices(OmegaConf.to_container(cfg.hydra.runtime.choices))
    OmegaConf.set_struct(cfg, False)
    del cfg["hydra"]
    return Composed(redact(resolved(cfg)), cfg, choices)


def _quote(text: str) -> str:
    """Hydra's single-quoted string: quotes escaped, and the backslashes before a quote or the end doubled."""
    return QuotedString(text=text, quote=Quote.single).with_quotes()


def format_value(value: object) -> str:
    """A Python value in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)  # a float's shortest round-trip text; 'nan', 'inf' and '-inf' as the grammar spells them
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{_key(k)}:{format_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    text = str(value)
    if _UNQUOTED.match(text) and text.lower() not in _KEYWORDS and "${" not in text:
        return text
    return _quote(text)


def _key(key: object) -> str:
    k = str(key)
    return k if re.match(r"^[A-Za-z_][\w\-]*$", k) else _quote(k)


def same(a: object, b: object) -> bool:
    """Equal as config values: a bool is not 1, NaN equals NaN, containers compare element by element."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=False))
    return a == b


@dataclass(frozen=True)
class LeafDiff:
    key: str
    op: str  # set | add | remove
    value: object = None

    def override(self) -> str:
        if self.op == "remove":
            return f"~{self.key}"
        return f"{'+' if self.op == 'add' else ''}{self.key}={format_value(self.value)}"


def leaf_diffs(current: Mapping[str, Any], target: Mapping[str, Any], prefix: str = "") -> list[LeafDiff]:
    """What to set on ``current`` to reach ``target`` (dicts recurse, lists whole, redacted values never compared)."""
    out: list[LeafDiff] = []
    for key in list(current) + [k for k in target if k not in current]:
        path = f"{prefix}{key}"
        a, b = current.get(key, ABSENT), target.get(key, ABSENT)
        if a == MASK or b == MASK:
            continue
        if b is ABSENT:
            out.append(LeafDiff(path, "remove"))
        elif a is ABSENT:
            out.append(LeafDiff(path, "add", b))
        elif isinstance(a, Mapping) and isinstance(b, Mapping):
            out.extend(leaf_diffs(a, b, f"{path}."))
        elif not same(a, b):
            out.append(LeafDiff(path, "set", b))
    return out


@dataclass
class ConfigDiff:
    overrides: list[str]  # apply after base_overrides
    base_overrides: list[str]  # A's overrides (recorded or reconstructed)
    digests: list[tuple[str, str, str]]  # (name, A, B) for those that differ
    notes: list[str]
    verified: bool  # compose(base - superseded + overrides + drift) == B's recorded config
    unreproduced: list[str] = field(default_factory=list)  # keys still differing after the overrides
    # overrides on keys where A and B were recorded alike but today's conf/ composes A's overrides
    # differently (the conf changed since they ran): needed to reproduce B today, not a difference
    drift: list[str] = field(default_factory=list)
    added_since: list[str] = field(default_factory=list)  # keys in today's conf/ that neither record has
    # A's overrides inside a group B chose otherwise (B's option may lack their keys): left out of A's
    superseded: list[str] = field(default_factory=list)

    def command(self) -> str:
        """One pasteable line: A's overrides (less those set again later), then the diff."""
        later = {_override_key(o) for o in (*self.overrides, *self.drift)}
        base = [o for o in self.base_overrides if o not in self.superseded
                and (o.startswith(("+", "~")) or _override_key(o) not in later)]
        return shlex.join(["python", "-m", "cupid_exp", *base, *self.overrides, *self.drift])


def _try_compose(overrides: Sequence[str]) -> Composed | None:
    try:
        return compose(overrides)
    except Exception:
        return None


def _extend(prefix: list[str], batch: Sequence[str], failed: list[str]) -> tuple[list[str], Composed | None]:
    """The overrides of ``batch`` that compose after ``prefix`` (rejected ones in ``failed``), and their config."""
    if (composed := _try_compose([*prefix, *batch])) is not None:
        return list(batch), composed
    added: list[str] = []
    for override in batch:  # one at a time: those that compose after the ones kept so far
        if (attempt := _try_compose([*prefix, *added, override])) is None:
            failed.append(override)
        else:
            added, composed = [*added, override], attempt
    return added, composed


def _implied(prefix: list[str], added: list[str], composed: Composed) -> list[str]:
    """``added`` without group choices another brings along (``model=gpt4o`` implies ``evaluator=gpt4o``)."""
    kept = list(added)
    for override in added:
        trial = [o for o in kept if o != override]
        attempt = _try_compose([*prefix, *trial])
        if attempt is not None and attempt.choices == composed.choices:
            kept = trial
    return kept


def overrides_to_reach(base: Sequence[str], target: RunSpec, *, max_rounds: int = 6, who: str = "B"
                       ) -> tuple[list[str], list[str], list[LeafDiff], list[str]]:
    """Overrides that, after ``base`` (less ``superseded``), compose ``target.config``: group choices first, then
    leaves (sources before derived); with notes, what still differs after them, and ``superseded``: the base
    overrides inside a group the target chose otherwise (its schema may lack their keys), left out to compose."""
    failed: list[str] = []
    base, superseded = list(base), []
    composed = compose(base)
    out: list[str] = []

    # 1. group choices: top-level groups, then nested ones (llm@evaluator.judge) still differing. Top-level
    # twice: a choice can imply another (model=gpt4o brings evaluator=gpt4o), which B may have overridden.
    for nested in (False, False, True):
        wanted = []
        for group in sorted(set(composed.choices) | set(target.choices)):
            if ("@" in group) != nested or not target.choices:
                continue
            have, want = composed.choices.get(group), target.choices.get(group)
            if have != want:
                wanted.append(f"~{group}" if want is None else f"{'+' if have is None else ''}{group}={want}")
        wanted = [w for w in wanted if w not in failed]
        # base overrides inside the nodes these choices fill (``setting.top_k=3`` inside ``setting=standard``)
        nodes = [_override_key(w).split("@", 1)[-1] + "." for w in wanted]
        stale = [o for o in base if any(_override_key(o).startswith(node) for node in nodes)]
        if stale and _try_compose([*base, *out, *wanted]) is None:
            kept = [o for o in base if o not in stale]
            if _try_compose([*kept, *out, *wanted]) is not None:
                base, superseded = kept, superseded + stale
        if wanted:
            added, attempt = _extend([*base, *out], wanted, failed)
            composed = attempt or composed  # None only when nothing was added: then there is nothing to drop
            out += _implied([*base, *out], added, composed)

    # 2. leaves: sources first, derived values only if still different
    for _ in range(max_rounds):
        diffs = [d for d in leaf_diffs(composed.resolved, target.config) if d.override() not in failed]
        if not diffs:
            break
        sources = [d for d in diffs if not composed.derived(d.key)]
        added, attempt = _extend([*base, *out], [d.override() for d in (sources or diffs)], failed)
        out += added
        composed = attempt or composed
        if not added and len(sources) == len(diffs):
            break
    remaining = leaf_diffs(composed.resolved, target.config)
    notes = []
    absent = [o[1:] for o in failed if o.startswith("~") and "=" not in o]
    if absent:
        notes.append(f"{who}'s record lacks keys the current conf/ always has (recorded under another schema?); "
                     f"no override removes them: {', '.join(absent)}")
    other = [o for o in failed if not (o.startswith("~") and "=" not in o)]
    if other:
        notes.append(f"not expressible as overrides under the current conf/: {' '.join(other)}")
    return out, notes, remaining, superseded


def diff_runs(a: RunSpec, b: RunSpec) -> ConfigDiff:
    notes: list[str] = []
    if not leaf_diffs(a.config, b.config):
        notes.append("A's and B's recorded resolved configs are identical")
    if a.overrides is None:
        base, rebuild_notes, missing, _ = overrides_to_reach([], a, who="A")
        notes.append(f"A's overrides are not recorded; reconstructed as: {' '.join(base) or '(none)'}")
        notes += rebuild_notes
        if missing:
            notes.append("A's recorded config is not reproducible under the current conf/ "
                         f"({', '.join(d.key for d in missing)})")
    else:
        base = list(a.overrides)
    composed_a = compose(base)
    drift = [d.key for d in leaf_diffs(composed_a.resolved, a.config)]
    drift_groups = {g for g in set(composed_a.choices) | set(a.choices)
                    if a.choices and composed_a.choices.get(g) != a.choices.get(g)}
    if a.overrides is not None and drift:
        notes.append("A's overrides compose differently under the current conf/ than when A ran "
                     f"({', '.join(drift[:8])}{', …' if len(drift) > 8 else ''}); the overrides below "
                     "reach B from A's overrides as they compose today")
    reach, more_notes, still, superseded = overrides_to_reach(base, b)
    notes += more_notes
    # keys today's conf/ has that neither A's nor B's record has: added to the schema since both ran
    added_since = [d.key for d in still if d.op == "remove" and a.select(d.key) is ABSENT]
    if added_since:
        notes.append("keys added to conf/ since both runs (in neither record; not counted as differences): "
                     + ", ".join(added_since))
        notes = [n for n in notes if not n.startswith("B's record lacks keys")]
    remaining = [d.key for d in still if d.key not in added_since]
    overrides, drifted = [], []
    for override in reach:
        (drifted if _is_drift(override, a, b, drift, drift_groups) else overrides).append(override)
    digests = [(k, a.digests[k], b.digests[k]) for k in DIGESTS
               if k in a.digests and k in b.digests and a.digests[k] != b.digests[k]]
    unknown = [f"{k} ({', '.join(s for s, spec in (('A', a), ('B', b)) if k not in spec.digests)})"
               for k in DIGESTS if (k in a.digests) != (k in b.digests)]
    if unknown:
        notes.append("not recorded, so not compared: " + ", ".join(unknown))
    if json.dumps(MASK) in json.dumps(b.config, default=str):  # a value that is the mask
        notes.append("secret-looking values are redacted in the records and were not compared")
    return ConfigDiff(overrides, base, digests, notes, not remaining, remaining, drifted, added_since, superseded)


def _override_key(override: str) -> str:
    return override.lstrip("~+").split("=", 1)[0]


def _is_drift(override: str, a: RunSpec, b: RunSpec, drift_keys: Sequence[str], drift_groups: set[str]) -> bool:
    """True when ``override`` only undoes conf drift since A was recorded, on which A and B agree."""
    key = _override_key(override)
    if key in a.choices or key in b.choices or "@" in key:  # a group choice
        return key in drift_groups and a.choices.get(key) == b.choices.get(key)
    if not any(d == key or d.startswith(key + ".") or key.startswith(d + ".") for d in drift_keys):
        return False
    va, vb = a.select(key), b.select(key)
    return (va is ABSENT and vb is ABSENT) or (va is not ABSENT and vb is not ABSENT and same(va, vb))


def render(diff: ConfigDiff, a: RunSpec, b: RunSpec) -> str:
    lines = [f"# A: {a.label}", f"# B: {b.label}"]
    if diff.base_overrides:
        lines.append(f"# A's overrides: {shlex.join(diff.base_overrides)}")
    if diff.superseded:
        lines.append(f"# leave out of A's overrides (inside a group B chose otherwise): {shlex.join(diff.superseded)}")
    if diff.overrides:
        lines += [shlex.quote(o) for o in diff.overrides]
    elif diff.verified or not leaf_diffs(a.config, b.config):
        lines.append("# no differences between A's and B's resolved configs")
    else:
        lines.append("# no override expresses the differences (see the notes)")
    if diff.drift:
        lines.append("# conf/ has changed since these runs; to reproduce B under today's conf/, also apply:")
        lines += [shlex.quote(o) for o in diff.drift]
    lines += [f"# {name}: {va} -> {vb}" for name, va, vb in diff.digests]
    lines += [f"# note: {note}" for note in diff.notes]
    if diff.verified:
        lines.append(f"# verified: A's overrides{' (less those left out)' if diff.superseded else ''} "
                     "+ the overrides above compose B's resolved config"
                     + (" (on every key B's record has)" if diff.added_since else ""))
    else:
        lines.append(f"# NOT reproduced: still different after the overrides: {', '.join(diff.unreproduced)}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cupid_exp.diff",
                                description="What differs between two runs, as Hydra overrides (B relative to A).")
    p.add_argument("a", help="MLflow run id (or its first digits, when unique) or job output dir")
    p.add_argument("b", help="MLflow run id (or its first digits, when unique) or job output dir")
    p.add_argument("--tracking-uri", default=None,
                   help=f"default: $MLFLOW_TRACKING_URI, else {DEFAULT_TRACKING_URI}")
    p.add_argument("--shell", action="store_true",
                   help="print one command line: python -m cupid_exp <A's overrides> <the diff>")
    args = p.parse_args(argv)
    try:
        uri = tracking_uri(args.tracking_uri)
        a, b = load_spec(args.a, uri), load_spec(args.b, uri)
    except (ValueError, FileNotFoundError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    diff = diff_runs(a, b)
    sys.stdout.write(diff.command() + "\n" if args.shell else render(diff, a, b))
    return 0 if diff.verified else 1
