"""Progress: on a terminal a bar per stage; elsewhere (nohup, SLURM, CI) a line every ``runtime.progress_every_s``, so a
log is never silent. Observers hear of finished instances through ``InstanceObserver``."""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Iterable, Mapping, Protocol

from cupid_exp.llm.calls import CallLog
from cupid_exp.llm.usage import UsageMeter, failed_calls

if TYPE_CHECKING:
    from tqdm import tqdm


class InstanceObserver(Protocol):
    """Told of every instance as it finishes, on the event loop: must return quickly and never raise."""

    @property
    def wants_calls(self) -> bool:
        """Whether to log the instance's model calls (``cupid_exp.llm.calls``) for it."""

    def instance_finished(self, instance: object, result: object, record: Mapping[str, object],
                          calls: CallLog | None) -> None:
        ...


def wants_calls(observer: InstanceObserver | None) -> bool:
    """Whether each instance's model calls must be logged for ``observer`` (none: no)."""
    return observer is not None and observer.wants_calls


class Totals(Protocol):
    """A job's usage meter, or its totals as the run worker last heard them."""

    def totals(self) -> dict[str, float]: ...


def read_totals(meter: Totals) -> dict[str, float]:
    """The meter's totals from another thread, retried when a counter is added meanwhile."""
    for _ in range(20):
        try:
            return meter.totals()
        except RuntimeError:
            time.sleep(0.001)
    return {}


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{secs:02d}s"


class ProgressLines:
    """A progress line every ``every_s`` from its own thread, so a job whose loop is busy still says where it is."""

    def __init__(self, progress: Progress, every_s: float):
        self.progress, self.every_s = progress, every_s
        self.started = time.monotonic()
        self.printed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cupid-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.emit()

    def line(self) -> str:
        done, total = self.progress.instances_done, self.progress.total
        totals = read_totals(self.progress.meter)
        elapsed = time.monotonic() - self.started
        rate = done / elapsed * 60 if elapsed > 0 else 0.0
        left = f", ~{_duration((total - done) / rate * 60)} left" if 0 < done < total and rate > 0 else ""
        noun = self.progress.noun
        return (f"progress: {done}/{total} {noun} ({100 * done / total:.0f}%); "
                f"calls {int(totals.get('calls', 0))} ({int(totals.get('cache_hits', 0))} cached, "
                f"{int(failed_calls(totals))} failed); ${totals.get('cost_usd', 0.0):.4f}; "
                f"{rate:.1f} {noun}/min; {_duration(elapsed)} elapsed{left}")

    def emit(self) -> None:
        print(self.line(), file=sys.stderr, flush=True)
        self.printed += 1

    def close(self) -> None:
        """Stop; a job that said where it was says where it ended."""
        self._stop.set()
        self._thread.join()
        if self.printed:
            self.emit()


class Progress:
    """What a job shows of its progress: bars on a terminal, else a line every ``every_s`` seconds (0: none)."""

    def __init__(self, stages: Iterable[str], total: int, meter: UsageMeter, enabled: bool = True,
                 every_s: float = 0.0, noun: str = "instances"):
        self.meter, self.stages, self.total = meter, list(stages), total
        self.noun = noun  #: what the job's units are (a synthesis job's: personas)
        self.counts = {stage: 0 for stage in self.stages}
        self.bars: dict[str, tqdm] = {}
        self.lines: ProgressLines | None = None
        if not (enabled and total > 0):
            return
        if not sys.stderr.isatty():
            if every_s > 0:
                self.lines = ProgressLines(self, every_s)
            return  # no bars, and no tqdm import (a tenth of a second or two, in the model phase)
        from tqdm import tqdm

        self.bars = {stage: tqdm(total=total, desc=f"{stage:<10}", unit="inst", position=i, leave=True,
                                 dynamic_ncols=True)
                     for i, stage in enumerate(self.stages)}

    @property
    def instances_done(self) -> int:
        """Instances through every stage."""
        return min(self.counts.values(), default=0)

    def instance_done(self) -> None:
        """Every stage of one instance (one that another process ran: runtime.workers)."""
        for stage in self.stages:
            self.done(stage)

    def done(self, stage: str) -> None:
        self.counts[stage] = self.counts.get(stage, 0) + 1
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
        if self.lines is not None:
            self.lines.close()
            self.lines = None
