"""The run's tally (items done of submitted, warm hits, enter seconds paid) and its terminal progress line."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from calque.models import Summary
from calque.pool.cost import cost_line, run_cost


@dataclass
class Tally:
    """What every call of one ``calque run`` submitted and got back (thread-safe)."""

    items_total: int = 0
    items_done: int = 0
    items_failed: int = 0
    summaries: list[Summary] = field(default_factory=list)
    local_enter_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _bar: Any = None
    _task: Any = None

    def submitted(self, n: int) -> None:
        with self._lock:
            self.items_total += n
        self._refresh()

    def finished(self, done: int, failed: int, summary: Summary | None = None) -> None:
        with self._lock:
            self.items_done += done
            self.items_failed += failed
            if summary is not None:
                self.summaries.append(summary)
        self._refresh()

    @property
    def warm_hits(self) -> int:
        return sum(1 for s in self.summaries if s.warm_hit)

    @property
    def enter_seconds_paid(self) -> float:
        return sum(s.enter_seconds_paid for s in self.summaries) + self.local_enter_seconds

    def _refresh(self) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=self.items_done, total=max(self.items_total, 1),
                             warm=f"warm hits {self.warm_hits}/{len(self.summaries)}",
                             enter=f"enter paid {self.enter_seconds_paid:.1f}s")  # fmt: skip

    def start_progress(self) -> None:
        """A live line on stderr, only when stderr is a terminal (logs and pipes get the summary only)."""
        if not sys.stderr.isatty():
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("items"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[warm]}"),
                             TextColumn("{task.fields[enter]}"), TimeElapsedColumn(),
                             console=Console(stderr=True), transient=True)  # fmt: skip
        self._task = self._bar.add_task("items", total=1, warm="warm hits 0/0", enter="enter paid 0.0s")
        self._bar.start()

    def stop_progress(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def lines(self, where: str) -> list[str]:
        """The closing summary: items, claims, warm hits, enter paid; and the cost line for pool runs."""
        head = f"calque run: {self.items_done} of {self.items_total} items done ({self.items_failed} failed) {where}"
        if not self.summaries:
            return [head + f"; enter paid {self.local_enter_seconds:.2f}s"] if self.items_total else [head]
        claims = len(self.summaries)
        paid = self.enter_seconds_paid
        out = [f"{head}; claims {claims}, warm hits {self.warm_hits}/{claims}, enter paid {paid:.2f}s"]
        out.append(cost_line(run_cost(self.summaries), self.enter_seconds_paid))
        return out
