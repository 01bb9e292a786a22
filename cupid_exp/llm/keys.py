"""Credentials checked before the first call: a missing key is one line, not every instance failing ``auth``."""

from __future__ import annotations

import os
import re
from typing import Mapping

from cupid_exp.config import ModelConfig
from cupid_exp.errors import ConfigError

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
    first = next(iter(groups.values()))[0]
    hint = f"{first}.api_base=URL, {first}.api_key_env=VAR"
    if len(groups) == 1:
        whom = "the role" if len(next(iter(groups.values()))) == 1 else "these roles"
        return (f"{parts[0]}, which {'are' if plural else 'is'} not set; export {'them' if plural else 'it'} "
                f"or point {whom} at another endpoint ({hint})")
    return "; ".join(parts) + ("; none of these is set: export them or point the roles at other endpoints "
                               f"(e.g. {hint})")
