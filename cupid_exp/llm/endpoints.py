"""One spelling per endpoint (``localhost`` is ``127.0.0.1``), for the cache's namespace and a job's identity."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

_LOOPBACK = {"localhost": "127.0.0.1", "::1": "127.0.0.1", "[::1]": "127.0.0.1"}
_DEFAULT_PORTS = {"http": 80, "https": 443}


def canonical_api_base(api_base: str | None) -> str | None:
    """``api_base`` lower-cased, loopback as ``127.0.0.1``, without default port or trailing slash."""
    if not api_base:
        return api_base
    text = api_base.strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return text.rstrip("/")
    if not parts.scheme or not parts.hostname:
        return text.rstrip("/")
    scheme, host = parts.scheme, _LOOPBACK.get(parts.hostname, parts.hostname)  # urlsplit lower-cases both
    if ":" in host:  # an IPv6 address keeps its brackets
        host = f"[{host}]"
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = (f"{userinfo}@" if userinfo else "") + host
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        netloc += f":{port}"
    return urlunsplit((scheme, netloc, parts.path.rstrip("/"), parts.query, ""))
