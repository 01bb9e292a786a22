"""What the processes calling one pool tell each other (pause, cut, limits, pace, callers, last answer), as one JSON
file per pool under a ``filelock``. News older than ``FRESH_S`` is ignored: a limit may have changed."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cupid_exp.llm.pools import Pool

FRESH_S = 120.0  #: stated or learned limits older than this are not adopted
CALLING_S = 3.0  #: a process that has not exchanged for this long no longer takes a share of a given bound
ANSWERED_S = 1.0  #: when the endpoint last answered is published at most this precisely (one write a second)


@dataclass
class Seen:
    """What the other processes published since this one last looked."""

    cut: bool = False  #: one of them cut its concurrency limit on a 429: cut ours too (the cooldown applies)
    told: tuple[float | None, float | None] | None = None
    learned: tuple[float, float] | None = None  #: (rpm, the lowest refused rpm)
    processes: int = 0  #: processes calling the pool now (only counted where a bound is given)


class SharedPoolState:
    def __init__(self, path: Path, me: str | None = None):
        from filelock import FileLock

        self.path, self._lock = path, FileLock(str(path) + ".lock")  # the folder made at the first exchange
        self.me = me or str(os.getpid())  #: who publishes (a process id; tests give two pools two names)
        self._looked = time.time()  # cuts before this process started are not its to follow
        self.cut = False  #: this process cut its concurrency limit: the others will too, at the next exchange
        self.told: tuple[float | None, float | None] | None = None  #: limits the provider stated to this process
        self.learned: tuple[float, float] | None = None  #: (rpm, the lowest refused rpm) this process's refusals taught
        self._adopted = 0.0  # when the learned pace this process last adopted was published

    def exchange(self, pool: Pool, news: bool = False) -> Seen:
        """Publish this process's news (``pool``'s pause, stated limits, learned pace, cut), read the others'."""
        seen = Seen()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            try:
                state: dict[str, Any] = json.loads(self.path.read_text())
            except (OSError, ValueError):
                state = {}
            now, changed = time.time(), news
            if pool.pace.paused_until > state.get("paused_until", 0.0):
                state["paused_until"] = pool.pace.paused_until
                changed = True
            pool.pace.paused_until = max(pool.pace.paused_until, state.get("paused_until", 0.0))
            if pool.outage.answered_at > state.get("answered", 0.0) + ANSWERED_S:
                state["answered"] = pool.outage.answered_at
                changed = True
            pool.outage.answered_at = max(pool.outage.answered_at, state.get("answered", 0.0))
            if self.cut:
                state["cut"] = {"at": now, "by": self.me}
                self.cut, changed = False, True
            elif (cut := state.get("cut")) and cut["by"] != self.me and cut["at"] > self._looked:
                seen.cut = True
            told = state.get("told")
            if self.told is not None:
                state["told"] = {"limits": list(self.told), "at": now}
                self.told, changed = None, True
            elif told and now - told["at"] < FRESH_S:
                seen.told = (told["limits"][0], told["limits"][1])
            learned = state.get("learned")
            if self.learned is not None:
                rpm, refused = self.learned  # JSON has no infinity: None
                state["learned"] = {"rpm": rpm, "refused": None if refused == float("inf") else refused, "at": now,
                                    "by": self.me}
                self.learned, changed = None, True
            elif (learned and learned["by"] != self.me and now - learned["at"] < FRESH_S
                  and learned["at"] > self._adopted):
                refused = learned["refused"] if learned["refused"] is not None else float("inf")
                seen.learned = (learned["rpm"], refused)
                self._adopted = learned["at"]
            if pool.members.given.max_concurrency:
                calling = {pid: t for pid, t in state.get("calling", {}).items() if now - t < CALLING_S}
                calling[self.me] = now
                state["calling"], changed = calling, True
                seen.processes = len(calling)
            self._looked = now
            if changed:
                try:
                    self.path.write_text(json.dumps(state))
                except OSError:  # a full disk: the pool's news is advice to the other processes, not a result; the
                    pass  # job's own files say the failure, naming their folder
        return seen
