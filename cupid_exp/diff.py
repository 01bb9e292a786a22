"""What changed between two runs, as Hydra overrides: ``python -m cupid_exp.diff A B``.

A and B are MLflow run ids or Hydra job output dirs. The printed overrides, appended to A's
own overrides, make ``python -m cupid_exp`` compose B's resolved config:

- a config group whose choice changed is printed as the choice (``model=gpt4o``,
  ``model@evaluator.judge=local``, ``~group`` / ``+group=x`` when removed / added);
- then every leaf that still differs: ``key=value``, ``+key=value`` (added), ``~key`` (removed);
  a value that follows from another by interpolation (``tracking.uri`` from ``paths.output_root``)
  is not printed when setting its source already reproduces it;
- the prompt-set hash, dataset digest and git commit, when they differ, as ``#`` comments.

The overrides are computed — and then checked — by composing with Hydra's compose API against
the current ``conf/``: compose(A's overrides + printed) must equal B's recorded resolved config.
For an MLflow run, A's overrides are the job dir's ``.hydra/overrides.yaml`` when its ``output_dir``
tag still points at one, otherwise they are reconstructed from the run's group choices and config.
Secret-looking values are redacted in MLflow and are never compared.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import yaml  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from cupid_exp.secrets import redact  # noqa: E402

REDACTED = "***"
DIGESTS = ("prompts_digest", "dataset_digest", "git_commit")
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
_UNQUOTED = re.compile(r"^[A-Za-z_/][\w\-./@:+]*$")
_KEYWORDS = {"true", "false", "null", "none", "nan", "inf", "-inf", "+inf"}
_MISSING = object()


@dataclass
class RunSpec:
    """One side of a diff: what a run was composed from and what it resolved to."""

    label: str
    config: dict[str, Any]  # resolved (where resolvable), secrets redacted, no 'hydra' key
    choices: dict[str, str]  # config group -> option (Hydra's runtime.choices), hydra/* left out
    overrides: list[str] | None  # the task overrides it was launched with; None when unknown
    digests: dict[str, str] = field(default_factory=dict)


@dataclass
class ConfigDiff:
    overrides: list[str]  # apply after base_overrides
    base_overrides: list[str]  # A's overrides (recorded or reconstructed)
    digests: list[tuple[str, str, str]]  # (name, A, B) for those that differ
    notes: list[str]
    verified: bool  # compose(base + overrides + drift) == B's recorded config
    unreproduced: list[str] = field(default_factory=list)  # keys still differing after the overrides
    # overrides on keys where A and B were recorded alike but today's conf/ composes A's overrides
    # differently (the conf changed since they ran): needed to reproduce B today, not a difference
    drift: list[str] = field(default_factory=list)
    added_since: list[str] = field(default_factory=list)  # keys in today's conf/ that neither record has

    def command(self) -> str:
        return shlex.join(["python", "-m", "cupid_exp", *self.base_overrides, *self.overrides, *self.drift])


# --------------------------------------------------------------------------------------------
# loading


def _job_choices(raw: Mapping[str, Any] | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (raw or {}).items() if v is not None and not str(k).startswith("hydra/")}


def _resolved(cfg: Any) -> dict[str, Any]:
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


def spec_from_job_dir(path: str | Path) -> RunSpec:
    """A Hydra job output dir: .hydra/config.yaml, .hydra/hydra.yaml, .hydra/overrides.yaml (+ metrics.json)."""
    path = Path(path)
    hydra_dir = path / ".hydra"
    if not (hydra_dir / "config.yaml").exists():
        raise FileNotFoundError(f"{path} is not a Hydra job dir (no .hydra/config.yaml)")
    cfg = OmegaConf.load(hydra_dir / "config.yaml")
    config = redact({k: v for k, v in _resolved(cfg).items() if k != "hydra"})
    choices: dict[str, str] = {}
    if (hydra_dir / "hydra.yaml").exists():
        hydra_cfg = OmegaConf.load(hydra_dir / "hydra.yaml")
        raw = OmegaConf.select(hydra_cfg, "hydra.runtime.choices")
        choices = _job_choices(OmegaConf.to_container(raw) if raw is not None else None)
    overrides = None
    if (hydra_dir / "overrides.yaml").exists():
        overrides = [str(o) for o in (yaml.safe_load((hydra_dir / "overrides.yaml").read_text()) or [])]
    digests = {}
    metrics = path / "metrics.json"
    if metrics.exists():
        summary = json.loads(metrics.read_text())
        digests = {"prompts_digest": summary.get("prompts_digest"),
                   "dataset_digest": (summary.get("data") or {}).get("digest"),
                   "git_commit": summary.get("git_commit") or (summary.get("git") or {}).get("commit")}
        digests = {k: str(v) for k, v in digests.items() if v}
    return RunSpec(f"job dir {path}", config, choices, overrides, digests)


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
    # log_job writes 'choice.' + the group with characters outside [\w.\-/: ] (the '@') turned into ':'
    choices = _job_choices({k.removeprefix("choice.").replace(":", "@"): v
                            for k, v in run.data.params.items() if k.startswith("choice.")})
    overrides = None
    out_dir = run.data.tags.get("output_dir")
    if out_dir and (Path(out_dir) / ".hydra" / "overrides.yaml").exists():
        overrides = [str(o) for o in yaml.safe_load((Path(out_dir) / ".hydra" / "overrides.yaml").read_text()) or []]
    digests = {k: run.data.tags[k] for k in DIGESTS if run.data.tags.get(k)}
    if run.data.tags.get("git_dirty") == "true" and "git_commit" in digests:
        digests["git_commit"] += " (dirty)"
    return RunSpec(f"MLflow run {run_id}", redact(config), choices, overrides, digests)


def load_spec(ref: str, tracking_uri: str) -> RunSpec:
    if Path(ref).is_dir():
        return spec_from_job_dir(ref)
    if _RUN_ID.match(ref):
        return spec_from_mlflow(ref, tracking_uri)
    raise ValueError(f"{ref!r} is neither a job output dir nor an MLflow run id (32 hex characters)")


# --------------------------------------------------------------------------------------------
# composing


@dataclass
class Composed:
    resolved: dict[str, Any]
    unresolved: dict[str, Any]
    choices: dict[str, str]


def compose(overrides: Sequence[str], conf_dir: str | Path | None = None) -> Composed:
    """Compose ``conf/config.yaml`` with ``overrides`` as ``python -m cupid_exp`` would (no hydra key)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from cupid_exp.config import register_configs

    if conf_dir is None:
        from cupid_exp.resources import conf_dir as shipped_conf

        conf_dir = shipped_conf()
    register_configs()
    if GlobalHydra.instance().is_initialized():  # e.g. called from inside a Hydra app
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
    choices = _job_choices(OmegaConf.to_container(cfg.hydra.runtime.choices))
    OmegaConf.set_struct(cfg, False)
    del cfg["hydra"]
    return Composed(redact(_resolved(cfg)), OmegaConf.to_container(cfg, resolve=False), choices)


# --------------------------------------------------------------------------------------------
# override syntax


def _quote(text: str) -> str:
    """Hydra single-quoted string: escape quotes, and backslashes that precede a quote or the end."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            j = i
            while j < len(text) and text[j] == "\\":
                j += 1
            run = text[i:j]
            out.append(run * 2 if j == len(text) or text[j] == "'" else run)
            i = j
        elif text[i] == "'":
            out.append("\\'")
            i += 1
        else:
            out.append(text[i])
            i += 1
    return "'" + "".join(out) + "'"


def format_value(value: Any) -> str:
    """A Python value in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{_key(k)}:{format_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    text = str(value)
    if _UNQUOTED.match(text) and text.lower() not in _KEYWORDS and "${" not in text:
        return text
    return _quote(text)


def _key(k: Any) -> str:
    k = str(k)
    return k if re.match(r"^[A-Za-z_][\w\-]*$", k) else _quote(k)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@dataclass(frozen=True)
class LeafDiff:
    key: str
    op: str  # set | add | remove
    value: Any = None

    def override(self) -> str:
        if self.op == "remove":
            return f"~{self.key}"
        return f"{'+' if self.op == 'add' else ''}{self.key}={format_value(self.value)}"


def leaf_diffs(current: Mapping[str, Any], target: Mapping[str, Any], prefix: str = "") -> list[LeafDiff]:
    """What to set on ``current`` to reach ``target``; dicts recurse, lists are compared whole.

    Redacted values are never compared (neither side is known).
    """
    out: list[LeafDiff] = []
    for key in list(current) + [k for k in target if k not in current]:
        path = f"{prefix}{key}"
        a, b = current.get(key, _MISSING), target.get(key, _MISSING)
        if a == REDACTED or b == REDACTED:
            continue
        if b is _MISSING:
            out.append(LeafDiff(path, "remove"))
        elif a is _MISSING:
            out.append(LeafDiff(path, "add", b))
        elif isinstance(a, Mapping) and isinstance(b, Mapping):
            out.extend(leaf_diffs(a, b, f"{path}."))
        elif not _same(a, b):
            out.append(LeafDiff(path, "set", b))
    return out


def _lookup(tree: Mapping[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _is_interpolation(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


# --------------------------------------------------------------------------------------------
# the diff


def _try_compose(overrides: Sequence[str], conf_dir: str | Path | None) -> Composed | None:
    try:
        return compose(overrides, conf_dir)
    except Exception:
        return None


def _add_each(base: list[str], candidates: Iterable[str], conf_dir: str | Path | None,
              failed: list[str]) -> tuple[list[str], Composed | None]:
    """Append the candidates that compose; collect the ones Hydra rejects in ``failed``."""
    added: list[str] = []
    composed = None
    for override in candidates:
        attempt = _try_compose([*base, *added, override], conf_dir)
        if attempt is None:
            failed.append(override)
            continue
        added.append(override)
        composed = attempt
    return added, composed


def overrides_to_reach(base: Sequence[str], target: RunSpec, *, conf_dir: str | Path | None = None,
                       max_rounds: int = 6, who: str = "B") -> tuple[list[str], list[str], list[LeafDiff]]:
    """Overrides that, after ``base``, compose ``target.config``.

    Returns (overrides, notes, what still differs). Group choices first (only those that
    composing the top-level ones did not already bring along), then leaf values, sources of
    interpolations before the values derived from them.
    """
    failed: list[str] = []
    composed = compose(base, conf_dir)
    out: list[str] = []

    # 1. group choices: top-level groups, then nested ones (model@evaluator.judge) still differing
    for nested in (False, True):
        wanted = []
        for group in sorted(set(composed.choices) | set(target.choices)):
            if ("@" in group) != nested or not target.choices:
                continue
            have, want = composed.choices.get(group), target.choices.get(group)
            if have == want:
                continue
            if want is None:
                wanted.append(f"~{group}")
            elif have is None:
                wanted.append(f"+{group}={want}")
            else:
                wanted.append(f"{group}={want}")
        if wanted:
            attempt = _try_compose([*base, *out, *wanted], conf_dir)
            if attempt is not None:
                out += wanted
                composed = attempt
            else:
                added, attempt = _add_each([*base, *out], wanted, conf_dir, failed)
                out += added
                composed = attempt or composed

    # 2. leaves: sources first, derived values only if still different
    for _ in range(max_rounds):
        diffs = [d for d in leaf_diffs(composed.resolved, target.config) if d.override() not in failed]
        if not diffs:
            break
        sources = [d for d in diffs if not _is_interpolation(_lookup(composed.unresolved, d.key))]
        batch = [d.override() for d in (sources or diffs)]
        attempt = _try_compose([*base, *out, *batch], conf_dir)
        if attempt is not None:
            out += batch
            composed = attempt
        else:
            added, attempt = _add_each([*base, *out], batch, conf_dir, failed)
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
    return out, notes, remaining


def diff_runs(a: RunSpec, b: RunSpec, *, conf_dir: str | Path | None = None) -> ConfigDiff:
    notes: list[str] = []
    if not leaf_diffs(a.config, b.config):
        notes.append("A's and B's recorded resolved configs are identical")
    if a.overrides is None:
        base, rebuild_notes, missing = overrides_to_reach([], a, conf_dir=conf_dir, who="A")
        notes.append(f"A's overrides are not recorded; reconstructed as: {' '.join(base) or '(none)'}")
        notes += rebuild_notes
        if missing:
            notes.append("A's recorded config is not reproducible under the current conf/ "
                         f"({', '.join(d.key for d in missing)})")
    else:
        base = list(a.overrides)
    composed_a = compose(base, conf_dir)
    drift = [d.key for d in leaf_diffs(composed_a.resolved, a.config)]
    drift_groups = {g for g in set(composed_a.choices) | set(a.choices)
                    if a.choices and composed_a.choices.get(g) != a.choices.get(g)}
    if a.overrides is not None:
        if drift:
            notes.append("A's overrides compose differently under the current conf/ than when A ran "
                         f"({', '.join(drift[:8])}{', …' if len(drift) > 8 else ''}); the overrides below "
                         "reach B from A's overrides as they compose today")
    reach, more_notes, still = overrides_to_reach(base, b, conf_dir=conf_dir)
    notes += more_notes
    # keys today's conf/ has that neither A's nor B's record has: added to the schema since both ran
    added_since = [d.key for d in still if d.op == "remove" and _lookup(a.config, d.key) is _MISSING]
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
    if any(v == REDACTED for v in _walk(b.config)):
        notes.append("secret-looking values are redacted in the records and were not compared")
    return ConfigDiff(overrides, base, digests, notes, not remaining, remaining, drifted, added_since)


def _override_key(override: str) -> str:
    return override.lstrip("~+").split("=", 1)[0]


def _is_drift(override: str, a: RunSpec, b: RunSpec, drift_keys: Sequence[str], drift_groups: set[str]) -> bool:
    """True when ``override`` only undoes conf drift: A's overrides compose differently today than A's
    record there, and A's and B's records agree on it — so it is not a difference between A and B."""
    key = _override_key(override)
    if key in a.choices or key in b.choices or "@" in key:  # a group choice
        return key in drift_groups and a.choices.get(key) == b.choices.get(key)
    if not any(d == key or d.startswith(key + ".") or key.startswith(d + ".") for d in drift_keys):
        return False
    va, vb = _lookup(a.config, key), _lookup(b.config, key)
    return (va is _MISSING and vb is _MISSING) or (va is not _MISSING and vb is not _MISSING and _same(va, vb))


def _walk(tree: Any) -> Iterable[Any]:
    if isinstance(tree, Mapping):
        for v in tree.values():
            yield from _walk(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _walk(v)
    else:
        yield tree


def render(diff: ConfigDiff, a: RunSpec, b: RunSpec) -> str:
    lines = [f"# A: {a.label}", f"# B: {b.label}"]
    if diff.base_overrides:
        lines.append(f"# A's overrides: {shlex.join(diff.base_overrides)}")
    if diff.overrides:
        lines += [shlex.quote(o) for o in diff.overrides]
    elif diff.verified or not leaf_diffs(a.config, b.config):
        lines.append("# no differences between A's and B's resolved configs")
    else:
        lines.append("# no override expresses the differences (see the notes)")
    if diff.drift:
        lines.append("# conf/ has changed since these runs; to reproduce B under today's conf/, also apply:")
        lines += [shlex.quote(o) for o in diff.drift]
    for name, va, vb in diff.digests:
        lines.append(f"# {name}: {va} -> {vb}")
    for note in diff.notes:
        lines.append(f"# note: {note}")
    if diff.verified:
        lines.append("# verified: A's overrides + the overrides above compose B's resolved config"
                     + (" (on every key B's record has)" if diff.added_since else ""))
    else:
        lines.append(f"# NOT reproduced: still different after the overrides: {', '.join(diff.unreproduced)}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cupid_exp.diff",
                                description="What differs between two runs, as Hydra overrides (B relative to A).")
    p.add_argument("a", help="MLflow run id or job output dir")
    p.add_argument("b", help="MLflow run id or job output dir")
    p.add_argument("--tracking-uri", default="sqlite:///outputs/mlflow.db")
    p.add_argument("--shell", action="store_true",
                   help="print one command line: python -m cupid_exp <A's overrides> <the diff>")
    args = p.parse_args(argv)
    try:
        a, b = load_spec(args.a, args.tracking_uri), load_spec(args.b, args.tracking_uri)
    except (ValueError, FileNotFoundError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    diff = diff_runs(a, b)
    sys.stdout.write(diff.command() + "\n" if args.shell else render(diff, a, b))
    return 0 if diff.verified else 1


if __name__ == "__main__":
    raise SystemExit(main())
