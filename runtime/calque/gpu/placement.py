"""The MIG placement grid: which sets of GPU instances a card accepts, and a search that places them.

A card is a row of memory slices (``placement_units``); a GPU-instance profile may start only at its
listed starts and covers ``size`` slices. A set of instances is valid when no two overlap, no profile
exceeds its max count, the total stays within the card's instance and compute-slice limits, and at
most one media-extension (+me) instance exists. The simulator refuses what ``problems`` reports, and
the planner places new instances with ``place``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from calque.gpu.catalog import Card, GiProfile

Placed = tuple[GiProfile, int]  # (profile, start)


def _mask(p: GiProfile, start: int) -> int:
    return ((1 << p.placements.size) - 1) << start


def problems(card: Card, placed: Sequence[Placed]) -> list[str]:
    """Every reason the driver would refuse this set of instances (empty when it accepts it)."""
    out: list[str] = []
    used = 0
    for p, start in placed:
        if start not in p.placements.starts:
            out.append(f"{p.name} cannot start at {start} (valid starts: {p.placements.starts})")
            continue
        m = _mask(p, start)
        if used & m:
            out.append(f"{p.name} at {start} overlaps another instance")
        used |= m
    counts = Counter(p.name for p, _ in placed)
    for p in card.profiles:
        if counts[p.name] > p.max_count:
            out.append(f"{counts[p.name]}x {p.name} exceeds its max count {p.max_count}")
    if len(placed) > card.max_instances:
        out.append(f"{len(placed)} instances exceed the card's max {card.max_instances}")
    g = sum(p.compute_slices for p, _ in placed)
    if g > card.compute_slices:
        out.append(f"{g} compute slices exceed the card's {card.compute_slices}")
    if sum(1 for p, _ in placed if p.media_extension) > 1:
        out.append("at most one media-extension (+me) instance may exist")
    return out


def _order(p: GiProfile) -> tuple[int, int, str]:
    return (-p.memory_slices, -p.compute_slices, p.name)


def place(card: Card, fixed: Sequence[Placed], wanted: Sequence[GiProfile]) -> list[Placed] | None:
    """Starts for ``wanted`` that fit around ``fixed`` (largest first, backtracking), or None.

    The returned list is in creation order (largest first); ``fixed`` is not included.
    """
    if problems(card, fixed):
        return None
    todo = sorted(wanted, key=_order)
    counts = Counter(p.name for p, _ in fixed)
    total = Counter(p.name for p in todo)
    for p in card.profiles:
        if counts[p.name] + total[p.name] > p.max_count:
            return None
    if len(fixed) + len(todo) > card.max_instances:
        return None
    g = sum(p.compute_slices for p, _ in fixed) + sum(p.compute_slices for p in todo)
    media = sum(1 for p, _ in fixed if p.media_extension) + sum(1 for p in todo if p.media_extension)
    if g > card.compute_slices or media > 1:
        return None
    used = 0
    for p, s in fixed:
        used |= _mask(p, s)
    chosen: list[Placed] = []

    def search(i: int, used: int) -> bool:
        if i == len(todo):
            return True
        p = todo[i]
        # identical profiles take increasing starts: the same set in another order is not a new answer
        floor = chosen[-1][1] + 1 if chosen and chosen[-1][0].name == p.name else 0
        for s in p.placements.starts:
            m = _mask(p, s)
            if s < floor or used & m:
                continue
            chosen.append((p, s))
            if search(i + 1, used | m):
                return True
            chosen.pop()
        return False

    return list(chosen) if search(0, used) else None


def first_free_start(card: Card, placed: Sequence[Placed], p: GiProfile) -> int | None:
    """The driver's choice when no placement is given: the lowest free valid start."""
    used = 0
    for q, s in placed:
        used |= _mask(q, s)
    return next((s for s in p.placements.starts if not used & _mask(p, s)), None)
