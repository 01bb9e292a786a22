"""Dry run: placeholder replies that parse (``dry_reply``), so the estimate (``LLMClient._dry_run``) counts the calls a
real run makes."""

from __future__ import annotations

PLACEHOLDER = "(dry run)"
