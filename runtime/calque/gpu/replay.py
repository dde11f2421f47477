"""Replaying one MIG profile's recorded asks against a number of its instances.

An ask is a checkout as the registry saw it: a session that was granted at once, or a refusal (for
want of a free slice) that may have been granted later (its client waited). Replayed in time order
against ``n`` instances, an ask is admitted when fewer than ``n`` run, and then runs for its
duration; otherwise it is refused, and, if it was granted later in the history, tries again then.
The count of asks refused at their first try is what a layout with ``n`` such instances would have
refused, under two stated assumptions: sessions last as long as they did (or, for a refusal never
granted, the profile's median session), and nobody changed their asks because of the layout.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass(frozen=True)
class Ask:
    at: float
    duration: float
    later: tuple[float, float] | None = None  # (start, duration) of the session a refused ask got later


def refused(asks: list[Ask], n: int) -> int:
    """How many of ``asks`` a layout with ``n`` instances of their profile refuses at their first try."""
    events: list[tuple[float, int, float, bool, tuple[float, float] | None]] = [
        (a.at, i, a.duration, True, a.later) for i, a in enumerate(asks)
    ]
    heapq.heapify(events)
    running: list[float] = []  # end times
    count, seq = 0, len(asks)
    while events:
        at, _, duration, first, later = heapq.heappop(events)
        while running and running[0] <= at:
            heapq.heappop(running)
        if len(running) < n:
            heapq.heappush(running, at + max(duration, 0.0))
            continue
        if first:
            count += 1
            if later is not None:
                seq += 1
                heapq.heappush(events, (later[0], seq, later[1], False, None))
    return count


def peak(intervals: list[tuple[float, float]]) -> int:
    """The most intervals running at once (one ending as another starts counts once)."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    top = cur = 0
    for _, d in edges:
        cur += d
        top = max(top, cur)
    return top


def median(values: list[float], default: float) -> float:
    if not values:
        return default
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2
