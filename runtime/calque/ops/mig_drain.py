"""A MIG layout change that drains first (``drain``, as ``calque.gpu.gpu_layout`` applies one): the
GPUs the plan changes, and only those, take no new checkout while it waits and applies; the sessions
on instances it destroys run out by their own deadlines, for at most ``drain_wait`` seconds, and are
ended only with ``force``; the GPUs are undrained after. ``window``: the change runs only inside one
of these times (UTC), e.g. ``Sat,Sun 02:00-06:00``, ``Mon-Fri 22:00-06:00``, ``daily 03:00-04:00``;
outside, a plan that changes something is refused, and check mode says so.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from calque.errors import UsageError
from calque.gpu.migmodels import MigPlan, SliceHolder, runnable
from calque.ops.mig_sessions import SessionDaemon
from calque.timefmt import CLOCK, utc_text

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_WINDOW = re.compile(r"^\s*(\S+)\s+(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")
POLL_S = 1.0


@dataclass(frozen=True)
class Window:
    text: str
    days: frozenset[int]  # weekdays, Monday 0
    start: int  # minutes after midnight, UTC
    end: int

    def contains(self, t: datetime) -> bool:
        """A window that crosses midnight belongs to the day it starts on."""
        m, day = t.hour * 60 + t.minute, t.weekday()
        if self.start < self.end:
            return day in self.days and self.start <= m < self.end
        return (day in self.days and m >= self.start) or ((day - 1) % 7 in self.days and m < self.end)


def _days(text: str) -> frozenset[int]:
    if text == "daily":
        return frozenset(range(7))
    out: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        if first not in DAYS or (last and last not in DAYS):
            raise ValueError(part)
        a, b = DAYS.index(first), DAYS.index(last or first)
        out.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    return frozenset(out)


def parse_window(text: str) -> Window:
    m = _WINDOW.match(text)
    try:
        if m is None:
            raise ValueError(text)
        h1, m1, h2, m2 = (int(x) for x in m.groups()[1:])
        if h1 > 23 or h2 > 24 or m1 > 59 or m2 > 59 or (h1, m1) == (h2, m2):
            raise ValueError(text)
        return Window(text.strip(), _days(m.group(1).lower()), h1 * 60 + m1, h2 * 60 + m2)
    except ValueError:
        raise UsageError(
            f"window {text!r}: give days and a UTC time range, e.g. 'Sat,Sun 02:00-06:00', "
            "'Mon-Fri 22:00-06:00' or 'daily 03:00-04:00'"
        ) from None


def outside(windows: list[str], now: datetime) -> str | None:
    """Why a change may not run now (None inside a window, or with no window named)."""
    parsed = [parse_window(w) for w in windows]
    if not parsed or any(w.contains(now) for w in parsed):
        return None
    return (
        f"it is {now:%a %H:%M} UTC, outside the layout's change window ({'; '.join(w.text for w in parsed)}): "
        "the layout changes nothing now; run again inside the window (calque_gpu_layout_window)"
    )


def changing_gpus(plan: MigPlan, allow_reset: bool) -> list[int]:
    """The GPUs whose layout the apply changes: the only ones drained."""
    return [g.index for g in plan.gpus if runnable(g.ops, allow_reset)]


def late_sessions(plan: MigPlan, wait: float, now: float) -> str | None:
    """With a drain, busy instances the plan destroys are waited for when sessions alone hold them
    and each ends within ``wait``; else why the real run is refused without force (None: it is not)."""
    late = []
    for b in (b for g in plan.gpus for b in g.busy_destroyed):
        where = f"GPU {b.gpu_index} {b.profile}@{b.start}"
        if not b.sessions:
            late.append(f"{where} runs pids {b.pids} outside any session")
        late += [f"{where} {s.describe()}" for s in b.sessions if s.ends is None or s.ends.timestamp() > now + wait]
    if not late:
        return None
    return (
        f"the layout would destroy held slices that do not run out within the drain wait of {wait:g} s "
        f"(calque_gpu_layout_drain_wait): {'; '.join(late)}. Wait longer, or force it (--force; "
        "calque_gpu_layout_force: true in the calque.gpu.gpu_layout role), which ends them once the wait is over"
    )


@dataclass
class LayoutDrain:
    """Drains the changing GPUs that no one else has drained; ``release`` undrains those alone."""

    daemon: SessionDaemon
    gpus: list[int]
    reason: str
    say: Callable[[str], None]
    ours: list[int] = field(default_factory=list)

    def start(self) -> None:
        already = {d.gpu for d in self.daemon.drains()}
        for gpu in self.gpus:
            if gpu in already:
                self.say(f"GPU {gpu}: already drained; left drained after the layout change")
                continue
            self.daemon.drain(gpu, self.reason)
            self.ours.append(gpu)
            self.say(f"GPU {gpu}: drained (no new checkouts while its layout changes)")

    def wait_out(self, doomed: set[str], wait: float) -> list[SliceHolder]:
        """Until no live session holds a device the layout destroys, for at most ``wait`` seconds; the
        sessions still there then."""
        deadline = time.monotonic() + wait
        for _ in range(int(wait / POLL_S) + 2):  # bounded in count and in time
            holders, _note = self.daemon.holders()
            left = [h for u in sorted(doomed) for h in holders.get(u, [])]
            if not left or time.monotonic() >= deadline:
                return left
            ends = max((h.ends for h in left if h.ends), default=None)
            self.say(
                f"waiting for {len(left)} session(s) to run out"
                + (f" (the last by {utc_text(ends, CLOCK)})" if ends else "")
            )
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        return left

    def release(self) -> None:
        for gpu in self.ours:
            self.daemon.undrain(gpu)
            self.say(f"GPU {gpu}: undrained")
        self.ours = []


def predicted(gpus: list[int], plan: MigPlan, wait: float) -> list[str]:
    """What a drained apply does around the plan's operations, for check mode: before, and after."""
    waits = [s for g in plan.gpus for b in g.busy_destroyed for s in b.sessions]
    until = max((s.ends for s in waits if s.ends), default=None)
    out = [f"GPU {i}: drain (no new checkouts while its layout changes)" for i in gpus]
    if waits:
        by = f", the last by {utc_text(until)}" if until else ""
        limit = f"{timedelta(seconds=int(wait))}"
        out.append(f"wait up to {limit} for {len(waits)} session(s) on destroyed slices to run out{by}")
    return out
