"""The trace's whole-GPU tasks as a pool's claims, its weeks, and warmth fitted from history only.

- a claim per GPU: a task asking ``num_gpu`` whole GPUs becomes ``num_gpu`` claims of its run time
  (one worker per instance, one GPU each), arriving at its creation time;
- weeks are counted from ``start_day``; week ``k`` is scored with everything fitted on weeks before it;
- the hour-of-week fit reads only what was observable before ``before``: claims that arrived earlier,
  and of those still running then only that they were running (their end is clipped to ``before``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .mapping import DAY
from .trace import Task

WEEK = 7 * DAY
HOURS_PER_WEEK = 168


@dataclass(frozen=True)
class Claim:
    task: str
    arrival: float  # trace seconds
    work: float  # seconds of one GPU's work (the task's run time)


def claims_of(tasks: list[Task], start: float, end: float, max_work: float = 0.0) -> tuple[list[Claim], dict[str, int]]:
    """Whole-GPU tasks that ran, arriving in [start, end) (earlier ones still running at ``start`` arrive
    then with the work they had left), one claim per GPU; and the counts of what was set aside.
    ``max_work`` > 0 sets aside tasks that ran longer (services rather than a pool's claims)."""
    out: list[Claim] = []
    aside: dict[str, int] = {}
    for t in tasks:
        if t.num_gpu == 0 or (t.num_gpu == 1 and t.gpu_milli < 1000):
            why = "no GPU" if t.num_gpu == 0 else "fraction of a GPU (the session replay's)"
        elif t.scheduled is None or t.deleted is None or t.deleted < t.scheduled:
            why = "never scheduled (no run time)"
        elif t.created >= end or t.deleted <= start:
            why = "outside the window"
        elif max_work and t.deleted - t.scheduled > max_work:
            why = f"ran longer than {max_work:g} s (a service, not a claim)"
        else:
            arrival = max(t.created, start)
            work = t.deleted - t.scheduled - max(0.0, start - t.created)
            if work <= 0:
                why = "outside the window"
            else:
                out += [Claim(t.name, arrival, work)] * t.num_gpu
                continue
        aside[why] = aside.get(why, 0) + 1
    out.sort(key=lambda c: c.arrival)
    return out, aside


def hour_of_week(t: float, start: float) -> int:
    return int((t - start) // 3600) % HOURS_PER_WEEK


def week_of(t: float, start: float) -> int:
    return int((t - start) // WEEK)


def demand_by_hour(claims: list[Claim], start: float, before: float) -> dict[tuple[int, int], int]:
    """(week, hour of week) -> the most claims in progress at once during that hour, before ``before``.

    In progress: arrived and not yet finished as if each ran at once (the demand, not a pool's
    service of it). Only what was observable before ``before`` is read: later arrivals are dropped
    and every end is clipped to ``before`` (a claim running then was known to be running, no more).
    """
    marks: list[tuple[float, int]] = []
    for c in claims:
        if c.arrival >= before:
            continue
        marks += [(c.arrival, 1), (min(c.arrival + c.work, before), -1)]
    marks.sort(key=lambda m: (m[0], m[1]))  # an end before a start at the same second
    peak: dict[tuple[int, int], int] = {}
    level, hour_mark = 0, start
    for at, step in marks:
        while hour_mark + 3600 <= at:  # hours passed with ``level`` unchanged still saw it
            hour_mark += 3600
            if hour_mark < before and level:
                key = (week_of(hour_mark, start), hour_of_week(hour_mark, start))
                peak[key] = max(peak.get(key, 0), level)
        level += step
        if at < before and at >= start:
            key = (week_of(at, start), hour_of_week(at, start))
            peak[key] = max(peak.get(key, 0), level)
    return peak


def fit_hour_of_week(
    claims: list[Claim], start: float, before: float, quantile: float, headroom: int, cap: int
) -> list[int]:
    """Scheduled in-service instances for each of the week's 168 hours: the ``quantile`` over the whole
    weeks before ``before`` of that hour's peak demand, plus ``headroom``, at most ``cap``; 0 where no
    earlier week saw demand in that hour."""
    weeks = week_of(before, start)
    if weeks <= 0:
        return [0] * HOURS_PER_WEEK
    peaks = demand_by_hour(claims, start, start + weeks * WEEK)
    out = []
    for h in range(HOURS_PER_WEEK):
        seen = sorted(peaks.get((w, h), 0) for w in range(weeks))
        value = seen[min(len(seen) - 1, max(0, round(quantile * (len(seen) - 1))))]
        out.append(min(cap, value + headroom) if value else 0)
    return out
