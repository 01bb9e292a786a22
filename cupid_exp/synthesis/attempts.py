"""Every reply a persona got and why it was rejected (``persona_NNN.calls.jsonl``), to read a failing step back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cupid_exp.llm.calls import CallLog, CallRecord
from cupid_exp.synthesis.files import FileWrites


def attempt_line(record: CallRecord) -> dict[str, Any]:
    """One attempt, without the (long, repeated) prompt: the last message's tail says which attempt it was."""
    last = record.messages[-1]["content"] if record.messages else ""
    rejected = record.rejected
    return {"step": record.step, "attempt": record.attempt, "model": record.model, "cached": record.cached,
            "finish_reason": record.finish_reason, "seconds": round((record.ended_ns - record.started_ns) / 1e9, 2),
            "completion_tokens": record.completion_tokens, "reply": record.reply,
            "rejected": rejected.kind if rejected else None, "reason": rejected.message if rejected else None,
            "prompt_tail": last[-400:]}


class AttemptLog:
    """Appends the records of ``log`` not written yet to ``path`` (through ``writes``: off the event loop)."""

    def __init__(self, path: Path, log: CallLog | None, writes: FileWrites | None = None):
        self.path, self.log, self.written = path, log, 0
        self.writes = writes or FileWrites()

    def flush(self) -> None:
        if self.log is None or self.written >= len(self.log.calls):
            return
        new = self.log.calls[self.written:]
        self.written += len(new)
        self.writes.append(self.path, [json.dumps(attempt_line(r), ensure_ascii=False) + "\n" for r in new])
