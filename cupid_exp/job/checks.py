"""Checks that need the world (folders, prompts, tracking server, credentials), before any call: one line each."""

from __future__ import annotations

import logging
import os
import re
import string
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping

import yaml

from cupid_exp.config import AUTO_WORKERS, JobConfig, ModelConfig
from cupid_exp.errors import ConfigError, first_line
from cupid_exp.prompts import PromptSet

log = logging.getLogger(__name__)

TRACKING_TIMEOUT_S = 3.0


def check_writable(key: str, folder: str | Path) -> None:
    path = Path(folder).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".cupid-write-check-"):
            pass
    except OSError as exc:
        raise ConfigError(f"{key}={str(folder)!r} is not a writable folder ({exc.strerror or exc})") from None


def _placeholders(text: str | None) -> set[str]:
    return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(text or "") if name}


def check_prompts(prompts: PromptSet, needed: dict[str, set[str]]) -> None:
    """Each prompt file exists in the directory (no fallback), parses, and asks only for known placeholders."""
    where = f"prompts.dir={str(prompts.directory)!r}"
    missing = prompts.missing(needed)
    if missing:
        raise ConfigError(f"{where} lacks {', '.join(missing)}, which this job sends (its task, setting and "
                          "evaluator); no prompt is taken from elsewhere: add the file to that folder (the project's "
                          "own is under prompts/) or leave prompts.dir unset")
    for name, provided in needed.items():
        try:
            template = prompts.get(name)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"{where}: prompt {name} cannot be used ({type(exc).__name__}: "
                              f"{first_line(exc)})") from None
        try:
            unknown = sorted((_placeholders(template.system) | _placeholders(template.user)) - provided)
        except ValueError as exc:  # a stray "{" in the template
            raise ConfigError(f"{where}: prompt {name} is not a valid template ({exc})") from None
        if unknown:
            raise ConfigError(f"{where}: prompt {name} asks for placeholder(s) {unknown} that its step does not "
                              f"fill (it fills {sorted(provided)}; write a literal brace as '{{{{' or '}}}}')")


def check_tracking(cfg: JobConfig) -> None:
    """An MLflow server answers within a few seconds; a SQLite store's folder is writable."""
    tracking = cfg.tracking
    if not tracking.enabled or cfg.calls.dry_run:
        return
    uri = tracking.uri
    if uri.startswith("sqlite:///"):
        check_writable("tracking.uri", Path(uri.removeprefix("sqlite:///")).expanduser().parent)
    elif uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=TRACKING_TIMEOUT_S):
                pass
        except urllib.error.HTTPError:
            pass  # it answered: a server is there (a proxy may refuse /health)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ConfigError(f"tracking.uri={uri!r} is not reachable within {TRACKING_TIMEOUT_S:g} s ({reason}); "
                              "start the server, fix the URI, or run with tracking=none") from None


def prompt_set(directory: str | None) -> PromptSet:
    """The prompt files in effect; a missing ``prompts.dir`` is one ConfigError line."""
    if directory and not Path(directory).expanduser().is_dir():
        raise ConfigError(f"prompts.dir={directory!r} is not a directory (point it at a folder in the official "
                          "layout: evaluation/*.yaml, synthesis/*.yaml)")
    return PromptSet(directory)


def check_workers(cfg: JobConfig) -> None:
    """Embedded models run inside the job's process: every worker would load (and compute with) its own copy."""
    if cfg.runtime.workers == AUTO_WORKERS or cfg.runtime.workers <= 1 or cfg.calls.dry_run:
        return  # auto: one process with an embedded model (job.worker_count)
    embedded = cfg.embedded_model_names()
    if embedded:
        raise ConfigError(f"runtime.workers={cfg.runtime.workers}: {', '.join(embedded)} run(s) inside the job's "
                          "process, one copy per worker; use runtime.workers=1 with embedded models")


def check_keys(roles: Mapping[str, ModelConfig], dry_run: bool) -> None:
    """Every called role's provider has credentials (a missing key is one line, not every instance failing ``auth``);
    a dry run only warns."""
    line = missing_keys_line(roles)
    if line is not None and dry_run:
        log.warning("a real run would stop here: %s", line)
    elif line is not None:
        raise ConfigError(line)


def note_models(roles: Mapping[str, ModelConfig]) -> None:
    """One line per model litellm's map cannot vouch for (unknown id, past deprecation, no price), per endpoint."""
    from cupid_exp.llm.model_map import model_note

    groups: dict[tuple[str, str, str | None], tuple[ModelConfig, list[str]]] = {}
    for role, model in roles.items():
        groups.setdefault((model.name, model.litellm_model, model.api_base), (model, []))[1].append(role)
    for model, names in groups.values():
        note = model_note(model, names)
        if note is not None:
            level, text = note
            log.log(logging.WARNING if level == "warning" else logging.INFO, "%s", text)


def check_before_calls(cfg: JobConfig) -> None:
    """What every job checks before its first call, whatever its kind."""
    check_workers(cfg)
    check_writable("paths.output_root", cfg.paths.output_root)
    if cfg.calls.cache and not cfg.calls.dry_run:
        check_writable("calls.cache_dir", cfg.calls.cache_dir)
    check_tracking(cfg)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_key_env_name(role: str, model: ModelConfig) -> None:
    """``api_key_env`` names a variable; a value that is not a name may be the key itself: never echo it."""
    if model.api_key_env is not None and not _ENV_NAME.fullmatch(model.api_key_env):
        raise ConfigError(f"{role}.api_key_env must be the NAME of an environment variable (letters, digits, _), "
                          "not a key; its value is not shown here")


def missing_credentials(model: ModelConfig) -> tuple[str, bool] | None:
    """The variable(s) this model needs and lacks, as a phrase, and whether all of several are needed; None if none."""
    if model.is_embedded or model.api_base:
        return None
    own = model.api_key_env
    if own and os.environ.get(own):
        return None
    import litellm  # only here: a role whose own variable is set never pays litellm's import in the plan

    missing = list(litellm.validate_environment(model=model.litellm_model).get("missing_keys") or [])
    if not missing:  # litellm finds what it needs (or knows no requirement for this provider)
        return None
    others = [k for k in missing if k != own]
    if not own:
        return " and ".join(others), len(others) > 1
    return own + (f" (or {' and '.join(others)})" if others else ""), False


def missing_keys_line(roles: Mapping[str, ModelConfig]) -> str | None:
    """One line naming every role lacking credentials, with what to do; None when all can call."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    plural = False
    for role, model in roles.items():
        check_key_env_name(role, model)
        missing = missing_credentials(model)
        if missing:
            groups.setdefault((model.name, model.litellm_model, missing[0]), []).append(role)
            plural = plural or missing[1]
    if not groups:
        return None
    parts = [f"{', '.join(rs)} ({name}, {litellm_model}) {'needs' if len(rs) == 1 else 'need'} {phrase}"
             for (name, litellm_model, phrase), rs in groups.items()]
    first = next(iter(groups.values()))
    hint = f"{first[0]}.api_base=URL, {first[0]}.api_key_env=VAR"
    if len(groups) == 1:
        whom = "the role" if len(first) == 1 else "these roles"
        return (f"{parts[0]}, which {'are' if plural else 'is'} not set; export {'them' if plural else 'it'} "
                f"or point {whom} at another endpoint ({hint})")
    return "; ".join(parts) + ("; none of these is set: export them or point the roles at other endpoints "
                               f"(e.g. {hint})")
