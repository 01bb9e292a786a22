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


def _config_secrets(value: Any) -> Iterable[str]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            if is_secret_key(str(k)) and isinstance(v, str):
                yield v
            else:
                yield from _config_secrets(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _config_secrets(v)
    elif isinstance(value, str):
        # overrides such as "+model.params.api_key=sk-..." saved verbatim by Hydra
        name, sep, val = value.partition("=")
        if sep and is_secret_key(name.rsplit(".", 1)[-1].lstrip("+~")):
            yield val


def secret_values(config: Any = None) -> list[str]:
    """Secret strings known now: env vars named like keys/tokens, and values under secret config keys."""
    found = {v for k, v in os.environ.items() if _SECRET_ENV.search(k) and len(v) >= _MIN_SECRET_LEN}
    if config is not None:
        found |= {v for v in _config_secrets(config) if len(v) >= _MIN_SECRET_LEN}
    return sorted(found, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret and secret in text:
            text = text.replace(secret, MASK)
    return text


def scrub_file(path: Path, secrets: Iterable[str]) -> None:
    if path.is_file():
        text = path.read_text(encoding="utf-8", errors="replace")
        cleaned = scrub(text, secrets)
        if cleaned != text:
            path.write_text(cleaned, encoding="utf-8")


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


def install_log_scrubber(secrets: Iterable[str]) -> None:
    """Mask secrets in every handler of the root logger (Hydra's console and job-log handlers)."""
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
