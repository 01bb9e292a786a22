"""Keep API keys out of everything we write: logs, outputs, Hydra's saved config, MLflow.

Two nets: values under secret-looking config keys are replaced by '***' (``redact``),
and any occurrence of a secret value — from such keys or from environment variables
named like keys/tokens — is replaced in free text (``scrub``).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

MASK = "***"
_SECRET_KEY = re.compile(r"(api[_-]?key|secret|password|token|authorization|credential)", re.IGNORECASE)
_NOT_SECRET = re.compile(r"(_env|_tokens?|max_.*tokens?|budget_tokens|tokens?_.*)$", re.IGNORECASE)
_SECRET_ENV = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)
_MIN_SECRET_LEN = 8


def is_secret_key(name: str) -> bool:
    return bool(_SECRET_KEY.search(name)) and not _NOT_SECRET.search(name)


def redact(value: Any) -> Any:
    """Copy of a nested container with secret-looking keys' values replaced by '***'."""
    if isinstance(value, Mapping):
        return {k: MASK if is_secret_key(str(k)) and v not in (None, "") else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


def _names_secret_env(name: str) -> bool:
    """'api_key_env' and the like: the value is the NAME of an env var that holds a secret."""
    return name.lower().endswith("_env") and is_secret_key(name[: -len("_env")])


def _config_secrets(value: Any) -> Iterable[str]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            if is_secret_key(str(k)) and isinstance(v, str):
                yield v
            elif _names_secret_env(str(k)) and isinstance(v, str) and (named := os.environ.get(v)):
                yield named  # a key in an env var of any name, e.g. api_key_env: MY_CREDS
            else:
                yield from _config_secrets(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _config_secrets(v)
    elif isinstance(value, str):
        # overrides such as "+model.params.api_key=sk-..." saved verbatim by Hydra
        name, sep, val = value.partition("=")
        key = name.rsplit(".", 1)[-1].lstrip("+~")
        if sep and is_secret_key(key):
            yield val
        elif sep and _names_secret_env(key) and (named := os.environ.get(val)):
            yield named  # one read: the variable may be deleted by another thread between two


def env_snapshot() -> dict[str, str]:
    """A copy of os.environ that survives another thread (MLflow's telemetry) deleting a variable mid-read."""
    return {k: v for k in list(os.environ) if (v := os.environ.get(k)) is not None}


def secret_values(config: Any = None) -> list[str]:
    """Secret strings known now: env vars named like keys/tokens, and values under secret config keys."""
    found = {v for k, v in env_snapshot().items() if _SECRET_ENV.search(k) and len(v) >= _MIN_SECRET_LEN}
    if config is not None:
        found |= {v for v in _config_secrets(config) if len(v) >= _MIN_SECRET_LEN}
    return sorted(found, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret and secret in text:
            text = text.replace(secret, MASK)
    return text


def scrub_file(path: Path, secrets: Iterable[str]) -> None:
    """Mask secrets in a file in place, atomically (parallel jobs may scrub the sweep's multirun.yaml at once)."""
    if path.is_file():
        text = path.read_text(encoding="utf-8", errors="replace")
        cleaned = scrub(text, secrets)
        if cleaned != text:
            from cupid_exp.outputs import atomic_write_text

            atomic_write_text(path, cleaned)


class ScrubbingFilter(logging.Filter):
    """A logging filter that masks secret values in every record it passes."""

    def __init__(self, secrets: Iterable[str]):
        super().__init__()
        self.secrets = list(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            message = scrub(record.getMessage(), self.secrets)
            record.msg, record.args = message, None
        return True


_FACTORY_SECRETS: list[str] = []
_BASE_FACTORY: Any = None


def _install_record_factory(secrets: Iterable[str]) -> None:
    """Mask secrets in every log record when it is created: unlike handler filters, this survives
    Hydra re-configuring logging (its launchers do, then log each job's overrides)."""
    global _BASE_FACTORY
    _FACTORY_SECRETS[:] = sorted(set(_FACTORY_SECRETS) | {s for s in secrets if s}, key=len, reverse=True)
    if _BASE_FACTORY is not None:
        return
    _BASE_FACTORY = base = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = base(*args, **kwargs)
        if _FACTORY_SECRETS:
            try:
                message = record.getMessage()
            except Exception:  # noqa: BLE001  # a malformed record is logging's problem, not ours
                return record
            cleaned = scrub(message, _FACTORY_SECRETS)
            if cleaned != message:
                record.msg, record.args = cleaned, None
        return record

    logging.setLogRecordFactory(factory)


def install_log_scrubber(secrets: Iterable[str]) -> None:
    """Mask secrets in every log record (record factory) and in every handler of the root logger
    (Hydra's console and job-log handlers)."""
    secrets = list(secrets)
    _install_record_factory(secrets)
    scrubber = ScrubbingFilter(secrets)
    for handler in logging.getLogger().handlers:
        handler.filters = [f for f in handler.filters if not isinstance(f, ScrubbingFilter)]
        handler.addFilter(scrubber)


def scrub_obj(value: Any, secrets: list[str]) -> Any:
    """``scrub`` applied to every string inside a nested container."""
    if not secrets:
        return value
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, Mapping):
        return {k: scrub_obj(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub_obj(v, secrets) for v in value]
    return value
