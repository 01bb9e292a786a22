"""Progress: one bar per stage (summaries, inference, generation) with ETA, plus calls,
cache hits, tokens and cost so far. Silent when stderr is not a terminal or when
``runtime.progress=false``. Other watchers of a job (its live MLflow run) hear of each finished
instance through ``InstanceObserver``."""

from __future__ import annotations

import sys
from typing import Any, Iterable, Mapping, Protocol

from cupid_exp.llm.calls import CallLog
from cupid_exp.llm.usage import UsageMeter


class InstanceObserver(Protocol):
    """Told of every instance as it finishes, on the event loop: must return quickly and never raise."""

    @property
    def wants_calls(self) -> bool:
        """Whether to log the instance's model calls (``cupid_exp.llm.calls``) for it."""

    def instance_finished(self, instance: Any, result: Any, record: Mapping[str, Any], calls: CallLog | None) -> None:
        ...


def wants_calls(observer: InstanceObserver | None) -> bool:
    """Whether each instance's model calls must be logged for ``observer`` (none: no)."""
    return observer is not None and observer.wants_calls


class Progress:
    def __init__(self, stages: Iterable[str], total: int, meter: UsageMeter, enabled: bool = True):
        self.meter, self.stages = meter, list(stages)
        self.bars: dict[str, Any] = {}
        if not (enabled and sys.stderr.isatty() and total > 0):
            return  # no bars, and no tqdm import (a tenth of a second or two, in the model phase)
        from tqdm import tqdm

        self.bars = {stage: tqdm(total=total, desc=f"{stage:<10}", unit="inst", position=i, leave=True,
                                 dynamic_ncols=True)
                     for i, stage in enumerate(self.stages)}

    def instance_done(self) -> None:
        """Every stage of one instance (one that another process ran: runtime.workers)."""
        for stage in self.stages:
            self.done(stage)

    def done(self, stage: str) -> None:
        bar = self.bars.get(stage)
        if bar is None:
            return
        totals = self.meter.totals()
        bar.set_postfix(calls=int(totals.get("calls", 0)), cached=int(totals.get("cache_hits", 0)),
                        tokens=int(totals.get("prompt_tokens", 0) + totals.get("completion_tokens", 0)),
                        usd=f"{totals.get('cost_usd', 0.0):.4f}", refresh=False,
                        **({"batches": f"{b.pending} pending/{b.collected} done"} if (b := self.meter.batches).submitted
                           else {}))
        bar.update()

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
