"""The figures from a replay's outcomes: queue waits per lab, the allocation ratio while requests
waited, and each lab's deviation from its configured share while requests waited."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .driver import Outcome
from .mapping import SEVENTHS


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (nan for no values)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


@dataclass(frozen=True)
class Figures:
    n: int
    granted: int
    queued_at_end: int
    errors: int
    p50: float  # trace minutes (replay seconds x compression / 60)
    p95: float
    p99: float


def waits(outs: list[Outcome], end: float, compression: float) -> Figures:
    """Waits of granted requests, and of those still queued at the end counted up to the end (censored)."""
    w = [(o.granted if o.granted is not None else end) - o.arrival for o in outs if _counted(o)]
    w = [max(0.0, x) * compression / 60 for x in w]
    errors = sum(o.granted is None and not o.queued_at_end for o in outs)
    queued = sum(o.granted is None and o.queued_at_end for o in outs)
    return Figures(
        len(outs), sum(o.granted is not None for o in outs), queued, errors, *(pct(w, q) for q in (0.5, 0.95, 0.99))
    )


def _counted(o: Outcome) -> bool:
    """Granted, or still queued at the end (a refused request has no wait)."""
    return o.granted is not None or o.queued_at_end


def _held(o: Outcome, end: float) -> tuple[float, float] | None:
    if o.granted is None:
        return None
    return o.granted, min(o.released if o.released is not None else end, end)


def contended(outs: list[Outcome], end: float) -> list[tuple[float, float]]:
    """The stretches of the window during which at least one request waited."""
    waited = [(o.arrival, min(o.granted, end) if o.granted is not None else end) for o in outs if _counted(o)]
    marks = sorted([(a, 1) for a, b in waited if b > a] + [(b, -1) for a, b in waited if b > a])
    spans, depth, since = [], 0, 0.0
    for at, step in marks:
        if depth == 0 and step > 0:
            since = at
        depth += step
        if depth == 0 and at > since:
            spans.append((since, at))
    if depth > 0:
        spans.append((since, end))
    return spans


def _overlap(a: tuple[float, float], spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(a[1], b) - max(a[0], s)) for s, b in spans)


def allocation_ratio(outs: list[Outcome], end: float, sevenths: int) -> tuple[float, float]:
    """(allocated compute / the institution's while requests waited, the share of the window that was)."""
    spans = contended(outs, end)
    span_s = sum(b - a for a, b in spans)
    if span_s <= 0:
        return float("nan"), 0.0
    used = sum(_overlap(h, spans) * SEVENTHS[o.profile] for o in outs if (h := _held(o, end)))
    return used / (span_s * sevenths), span_s / end


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = [(max(s, t), min(e, f)) for s, e in a for t, f in b]
    return [(s, e) for s, e in out if e > s]


def all_waiting(outs: list[Outcome], end: float, labs: list[str]) -> list[tuple[float, float]]:
    """The stretches of the window during which every lab had a request waiting."""
    spans = [(0.0, end)]
    for lab in labs:
        spans = _intersect(spans, contended([o for o in outs if o.lab == lab], end))
    return spans


def share_deviation(outs: list[Outcome], end: float, shares: dict[str, float]) -> dict[str, tuple[float, float]]:
    """Per lab: (its share of the compute allocated while every lab had a request waiting, its configured
    share), both in %: only then can the order give each lab its share (a lab asking less than its share
    cannot get it). nan where no such time was."""
    spans = all_waiting(outs, end, list(shares))
    by_lab = {lab: 0.0 for lab in shares}
    for o in outs:
        if h := _held(o, end):
            by_lab[o.lab] = by_lab.get(o.lab, 0.0) + _overlap(h, spans) * SEVENTHS[o.profile]
    total = sum(by_lab.values())
    weight = sum(shares.values())
    return {lab: (100 * by_lab[lab] / total if total else float("nan"), 100 * shares[lab] / weight) for lab in shares}


def table(
    results: dict[str, list[Outcome]], end: float, compression: float, sevenths: int, shares: dict[str, float]
) -> list[str]:
    head = f"{'policy':<12} {'lab':<10} {'reqs':>5} {'granted':>7} {'queued@end':>10} {'err':>4} " + (
        f"{'wait p50':>9} {'p95':>8} {'p99':>8}  {'alloc %':>7} {'got % / share %':>16}"
    )
    lines = [head, "-" * len(head)]
    for policy, outs in results.items():
        ratio, contended_share = allocation_ratio(outs, end, sevenths)
        dev = share_deviation(outs, end, shares)
        every = sum(b - a for a, b in all_waiting(outs, end, list(shares)))
        for lab in [*shares, "overall"]:
            mine = outs if lab == "overall" else [o for o in outs if o.lab == lab]
            f = waits(mine, end, compression)
            if lab == "overall":
                worst = max((abs(g - s) for g, s in dev.values()), default=float("nan"))
                tail = f"{100 * ratio:>7.1f} {f'max dev {worst:.1f} pt':>16}"
            else:
                g, s = dev[lab]
                tail = f"{'':>7} {f'{g:.1f} / {s:.1f}':>16}"
            lines.append(
                f"{policy:<12} {lab:<10} {f.n:>5} {f.granted:>7} {f.queued_at_end:>10} {f.errors:>4} "
                f"{f.p50:>8.1f}m {f.p95:>7.1f}m {f.p99:>7.1f}m  {tail}"
            )
        lines.append(
            f"{'':<12} requests waited during {100 * contended_share:.0f} % of the window, "
            f"every lab at once during {100 * every / end:.0f} %"
        )
    return lines


@dataclass(frozen=True)
class Reclaim:
    ended: int  # sessions ended by idle reclaim
    active: int  # of those, ones whose holder was still busy when it ended (must be 0)
    idle_held_h: float  # slice-hours (trace) every session held its slice idle, after reclaim
    idle_reclaimed_h: float  # slice-hours (trace) the reclaimed sessions would have held idle on to their TTL


def reclaim_figures(outs: list[Outcome], end: float, compression: float) -> Reclaim:
    """Idle reclaim's work, from each session's busy spell, booked end and actual end (the hosts' audit)."""
    ended = active = 0
    idle_held = reclaimed = 0.0
    for o in outs:
        if o.granted is None or o.released is None:
            continue
        busy_until = min(o.busy_until if o.busy_until is not None else o.released, end)
        idle_held += max(0.0, min(o.released, end) - busy_until)
        if o.ended_by == "idle":
            ended += 1
            active += o.released < busy_until
            booked = o.booked_until if o.booked_until is not None else o.released
            reclaimed += max(0.0, min(booked, end) - max(o.released, busy_until))
    return Reclaim(ended, active, idle_held * compression / 3600, reclaimed * compression / 3600)


def reclaim_table(results: dict[str, list[Outcome]], end: float, compression: float) -> list[str]:
    head = (
        f"{'policy':<13} {'idle slice-h held':>17} {'reclaimed slice-h':>17} "
        f"{'sessions ended by reclaim':>25} {'of them active':>14}"
    )
    lines = [head, "-" * len(head)]
    for policy, outs in results.items():
        r = reclaim_figures(outs, end, compression)
        lines.append(f"{policy:<13} {r.idle_held_h:>17.1f} {r.idle_reclaimed_h:>17.1f} {r.ended:>25} {r.active:>14}")
    return lines
