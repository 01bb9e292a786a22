"""Keep API keys out of everything we write (logs, outputs, Hydra's files, MLflow): config data gets secret values
replaced by '***' (``redact``), free text every known secret value (``scrub``)."""

from __future__ import annotations

import functools
import logging
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping
from urllib.parse import unquote, urlsplit

from cupid_exp.outputs import atomic_write_text

MASK = "***"
_SECRET_KEY = re.compile(r"(api[_-]?key|secret|password|token|authorization|credential)", re.IGNORECASE)
_NOT_SECRET = re.compile(r"(_env|_tokens?|max_.*tokens?|budget_tokens|tokens?_.*)$", re.IGNORECASE)
_SECRET_ENV = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)
# Every value under these keys is a header sent with each call: any of them may authenticate it.
_HEADERS_KEY = re.compile(r"^(extra_)?headers$", re.IGNORECASE)
# "Bearer <token>": the token alone is a secret too (a provider's error may quote it without its scheme).
_AUTH_SCHEME = re.compile(r"^(?:bearer|basic|token|bot|apikey|api-key|digest)\s+(\S+)$", re.IGNORECASE)
_URL = re.compile(r"[a-z][a-z0-9+.-]*://[^\s'\"<>,\]\[{}]+", re.IGNORECASE)
# Query parameters that carry a credential besides the secret-looking names (Azure SAS "sig", Google "key").
_SECRET_QUERY = {"key", "sig", "signature", "code", "auth", "apikey"}
_MIN_SECRET_LEN = 8
# A value shaped like a provider's key, whatever setting it was given to (``model=sk-…`` is refused by quoting it):
# a known key prefix, or one word of letters, digits, '-' and '_' holding a random-looking run (``_random``).
_KEY_PREFIX = re.compile(r"^(?:(?:sk|pk|hf|ghp|gho|ghs|ghu|github_pat|gsk|glpat|r8|xai|nvapi|pplx|fw)[-_]|AIza|AKIA)"
                         r"[A-Za-z0-9_-]{12,}$")
_KEY_WORD = re.compile(r"^[A-Za-z0-9_-]{20,}$")
_RANDOM_RUN = re.compile(r"[A-Za-z0-9]{20,}")


def is_secret_key(name: str) -> bool:
    return bool(_SECRET_KEY.search(name)) and not _NOT_SECRET.search(name)


def looks_like_key(value: str) -> bool:
    """Whether ``value`` is shaped like an API key (``_KEY_PREFIX``, ``_KEY_WORD``), under any setting's name."""
    return bool(_KEY_PREFIX.match(value)) or bool(_KEY_WORD.match(value)) and any(
        _random(run) for run in _RANDOM_RUN.findall(value))


def _random(run: str) -> bool:
    """20+ letters and digits changing class at 40% of places or more, as random characters do; mixed case unless 48+
    long, so a git commit or run id (lower-case hex) is none."""
    classes = ["u" if c.isupper() else "l" if c.islower() else "d" for c in run]
    changes = sum(a != b for a, b in zip(classes, classes[1:], strict=False))
    return ("d" in classes and changes >= 0.4 * (len(run) - 1)
            and (len(run) >= 48 or "u" in classes and "l" in classes))


def is_headers_key(name: str) -> bool:
    return bool(_HEADERS_KEY.match(name))


def url_credentials(text: str) -> list[str]:
    """The credentials in ``text``'s URLs (user:password, password, secret query values), raw and decoded."""
    found: list[str] = []
    for match in _URL.finditer(text):
        try:
            parts = urlsplit(match.group())
        except ValueError:
            continue
        userinfo, at, _ = parts.netloc.rpartition("@")
        if at and userinfo:
            found += [userinfo, userinfo.replace(":", "\\:")]  # and as a sweep's job overrides escape it
            password = userinfo.partition(":")[2]
            found += [password, unquote(password)] if password else []
        for pair in parts.query.split("&"):
            name, _, value = pair.partition("=")
            if value and (is_secret_key(unquote(name)) or unquote(name).lower() in _SECRET_QUERY):
                found += [value, unquote(value)]
    return [s for s in dict.fromkeys(found) if s]


def mask_url_credentials(text: str) -> str:
    """``text`` with the credentials of its URLs replaced by '***' (``http://***@host/v1?api_key=***``)."""
    if "://" not in text:
        return text
    for secret in sorted(url_credentials(text), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def _masked(value: object) -> object:
    """A header block keeps its names, never its values; any other secret is one mask."""
    if isinstance(value, Mapping):
        return {k: _masked(v) for k, v in value.items()}
    return MASK if value not in (None, "") else value


def redact(value: Mapping[str, object]) -> dict[str, object]:
    """A copy with secret-looking keys' values, every header's value and URL credentials replaced by '***'."""
    return {k: (MASK if is_secret_key(str(k)) and v not in (None, "") and not isinstance(v, (Mapping, list, tuple))
                else _masked(v) if is_headers_key(str(k)) else _redacted(v)) for k, v in value.items()}


def _redacted(value: object) -> object:
    if isinstance(value, Mapping):
        return redact(value)
    if isinstance(value, (list, tuple)):
        return [_redacted(v) for v in value]
    if isinstance(value, str):
        return mask_url_credentials(value)
    return value


def _leaves(value: object) -> Iterator[str]:
    """Every string inside a nested container (a header block's values)."""
    if isinstance(value, (Mapping, list, tuple)):
        for v in value.values() if isinstance(value, Mapping) else value:
            yield from _leaves(v)
    elif isinstance(value, str):
        yield value
        if scheme := _AUTH_SCHEME.match(value.strip()):
            yield scheme.group(1)


def _texts(value: object) -> Iterator[str]:
    """Every string in a container, plus override values as Hydra reads them (escaped colons)."""
    for text in _leaves(value):
        yield text
        override = _parsed_override(text) if "=" in text else None
        if override is not None:
            yield from _leaves(override)


def _config_secrets(value: object) -> Iterable[str]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            # a key's name marks its own value (or a sweep's values: a list of strings), not a whole section
            # (hydra.callbacks.redact_secrets holds a class path)
            if (is_secret_key(str(k)) and (not isinstance(v, (Mapping, list, tuple))
                                           or all(isinstance(x, str) for x in v) and not isinstance(v, Mapping))
                    or is_headers_key(str(k))):
                yield from _leaves(v)
            elif (str(k).lower().endswith("_env") and is_secret_key(str(k)[:-4]) and isinstance(v, str)
                  and (named := os.environ.get(v))):
                yield named  # api_key_env and the like name the env var that holds a key: MY_CREDS
            else:
                yield from _config_secrets(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _config_secrets(v)
    elif isinstance(value, str):
        # overrides such as "+model.params.api_key=sk-..." or "+model.params.extra_headers={X-Key: ...}", saved
        # verbatim by Hydra
        override = _parsed_override(value)
        if override is not None:
            yield from _config_secrets(override)
            # a key given to the wrong setting (``model=sk-…``, an unknown choice): Hydra's refusal quotes it
            yield from (v for v in _leaves(override) if looks_like_key(v))


def _parsed_override(text: str) -> dict[str, object] | None:
    """An override as ``{last key: value}`` (a sweep's values in a list), parsed as Hydra does; None if none."""
    name, sep, raw = text.partition("=")
    if not sep or not _OVERRIDE_KEY.match(name):
        return None
    key = name.rsplit(".", 1)[-1].lstrip("+~")
    try:
        override = _override_parser().parse_override(text)
        if override.is_sweep_override():
            try:
                value: object = list(override.sweep_iterator())
            except Exception:  # noqa: BLE001 - glob() and the like need Hydra's loader: their strings will do
                value = list(override.sweep_string_iterator())
        else:
            value = override.value()
    except Exception:  # noqa: BLE001 - not an override Hydra can read: the text after '=' is its value
        value = raw
    return {key: value}


_OVERRIDE_KEY = re.compile(r"^[+~]{0,2}[\w.@/-]+$")


@functools.lru_cache(maxsize=1)
def _override_parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def env_snapshot() -> dict[str, str]:
    """A copy of os.environ that survives another thread (MLflow's telemetry) deleting a variable mid-read."""
    return {k: v for k in list(os.environ) if (v := os.environ.get(k)) is not None}


def secret_values(config: object = None) -> list[str]:
    """Secret strings known now: key-like env vars, secret config keys, headers, overrides, and URL credentials."""
    env = env_snapshot()
    found = {v for k, v in env.items() if _SECRET_ENV.search(k) and len(v) >= _MIN_SECRET_LEN}
    texts = list(env.values())
    if config is not None:
        found |= {v for v in _config_secrets(config) if len(v) >= _MIN_SECRET_LEN}
        texts += list(_texts(config))
    # long enough to be searched for in free text (a ``user:password`` pair is distinctive however short)
    found |= {c for text in texts if "://" in text for c in url_credentials(text)
              if len(c) >= _MIN_SECRET_LEN or (":" in c and len(c) >= 4)}
    return sorted(found, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str]) -> str:
    for secret in filter(None, secrets):  # an empty one would mask between every character
        text = text.replace(secret, MASK)
    return text


# A YAML value that now starts with the mask would read as an alias (``*``): such values are quoted whole.
_YAML_MASKED_VALUE = re.compile(r"^([ \t]*(?:-[ \t]+|[^\s#'\"][^:#\n]*:[ \t]+)+)(\*\*\*.*?)[ \t]*$", re.MULTILINE)


def scrub_file(path: Path, secrets: Iterable[str]) -> None:
    """Mask secrets in a file in place, atomically (parallel jobs may scrub one file); YAML stays YAML."""
    if path.is_file():
        text = path.read_text(encoding="utf-8", errors="replace")
        cleaned = scrub(text, secrets)
        if cleaned != text and path.suffix in (".yaml", ".yml"):
            cleaned = _YAML_MASKED_VALUE.sub(lambda m: m.group(1) + "'" + m.group(2).replace("'", "''") + "'", cleaned)
        if cleaned != text:
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
_BASE_FACTORY: Callable[..., logging.LogRecord] | None = None


def _install_record_factory(secrets: Iterable[str]) -> None:
    """Mask secrets in log records at creation: unlike a filter, it survives Hydra reconfiguring logging."""
    global _BASE_FACTORY
    _FACTORY_SECRETS[:] = sorted(set(_FACTORY_SECRETS) | {s for s in secrets if s}, key=len, reverse=True)
    if _BASE_FACTORY is not None:
        return
    _BASE_FACTORY = base = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
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
    """Mask secrets in every log record and in every root handler (Hydra's console and job log)."""
    secrets = list(secrets)
    _install_record_factory(secrets)
    scrubber = ScrubbingFilter(secrets)
    for handler in logging.getLogger().handlers:
        handler.filters = [f for f in handler.filters if not isinstance(f, ScrubbingFilter)]
        handler.addFilter(scrubber)


def scrub_obj(value: object, secrets: list[str]) -> object:
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
