"""The chat messages every model call sends, named once for the type checker."""

from __future__ import annotations

from typing import Any

#: one chat message as litellm takes it: ``role``, ``content`` (text, or parts), and whatever a provider adds
Message = dict[str, Any]
