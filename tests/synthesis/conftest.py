"""Make tests/llm/fault_server.py importable here (the scripted fault-injection server)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "llm"))
