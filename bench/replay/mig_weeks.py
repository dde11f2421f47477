"""``bench/mig_suggest.py`` on the trace (issue 37 part 5): a host's MIG layout suggested from earlier
weeks of the trace's fractional-GPU demand by calque's own ``suggest``, and scored on later weeks it
never saw, against the layout it replaced.

Every rule is printed at the top by ``lines``:

- the host: two A100-40GB cut as the session replay's institution (``institution.CARDS``); it gets
  every ``hosts``-th fractional task in arrival order (the rest go to the institution's other hosts);
- an ask: the task's creation time, its run time, and the smallest slice the layout offers covering
  its ``gpu_milli`` (what its holder would ask that host for: a layout without 2g slices gets a 2g-sized
  ask as a 3g one, and the registry records it so);
- an ask that finds every slice of its profile held waits (``checkout --wait``) up to ``max_wait_s``,
  first come first served per profile, and is lost after that;
- the fit reads only the history weeks (asks created before the first scored week, every session and
  wait clipped at that moment: what the registry held then); the scored weeks are replayed afresh on
  both layouts.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass

from calque.models.mig_history import History, Refusal, Use

from .mapping import DAY, covering
from .trace import Task

WEEK = 7 * DAY


@dataclass(frozen=True)
class Ask:
    at: float
    run_s: float
    milli: int


def host_asks(tasks: list[Task], hosts: int, index: int = 0) -> list[Ask]:
    """The fractional tasks that ran, every ``hosts``-th in arrival order from ``index``."""
    frac = sorted(
        (t for t in tasks if t.num_gpu == 1 and 0 < t.gpu_milli < 1000 and t.scheduled is not None and t.deleted),
        key=lambda t: (t.created, t.name),
    )
    return [
        Ask(t.created, max(0.0, t.deleted - t.scheduled), t.gpu_milli)
        for i, t in enumerate(frac)
        if i % hosts == index and t.deleted is not None and t.scheduled is not None
    ]


def replay_layout(
    asks: list[Ask], layout: Counter[str], max_wait_s: float, until: float, tag: str
) -> tuple[list[Use], list[Refusal], int]:
    """The asks on ``layout`` (profile -> slices): the registry's sessions and refusals, clipped at
    ``until``, and how many asks no slice of the layout covers."""
    offered = tuple(p for p, n in layout.items() if n > 0)
    by_profile: dict[str, list[Ask]] = {}
    uncovered = 0
    for a in asks:
        p = covering(a.milli, offered)
        if p is None:
            uncovered += 1
        else:
            by_profile.setdefault(p, []).append(a)
    uses: list[Use] = []
    refusals: list[Refusal] = []
    for p, mine in by_profile.items():
        u, r = _one_profile(mine, layout[p], max_wait_s, p, tag)
        uses += [Use(x.session_id, x.profile, x.gpu, x.start, min(x.end, until)) for x in u if x.start < until]
        refusals += [_clip(x, until) for x in r if x.first_at < until]
    return uses, refusals, uncovered


def _clip(r: Refusal, until: float) -> Refusal:
    """A wait still under way at ``until`` is, as the registry holds it then, not yet granted."""
    if r.last_at <= until:
        return r
    return Refusal(r.profile, r.first_at, until, r.attempts, None)


def _one_profile(asks: list[Ask], n: int, max_wait: float, profile: str, tag: str) -> tuple[list[Use], list[Refusal]]:
    uses: list[Use] = []
    refusals: list[Refusal] = []
    running: list[float] = []
    queue: list[tuple[float, float, float]] = []  # (refused at, gives up at, run time), first come first served

    def grant(at: float, dur: float) -> str:
        sid = f"{tag}-{profile}-{len(uses) + 1}"
        uses.append(Use(sid, profile, 0, at, at + dur))
        heapq.heappush(running, at + dur)
        return sid

    def free_until(t: float) -> None:
        while running and running[0] <= t:
            end = heapq.heappop(running)
            while queue and queue[0][1] < end:  # gave up before this slice freed: lost
                r_at, gave_up, _ = queue.pop(0)
                refusals.append(Refusal(profile, r_at, gave_up, 2))
            if queue:
                r_at, _, dur = queue.pop(0)
                refusals.append(Refusal(profile, r_at, end, 2, grant(end, dur)))

    for a in sorted(asks, key=lambda x: x.at):
        free_until(a.at)
        if len(running) < n:
            grant(a.at, a.run_s)
        else:
            queue.append((a.at, a.at + max_wait, a.run_s))
    free_until(math.inf)
    refusals += [Refusal(profile, r_at, gave_up, 2) for r_at, gave_up, _ in queue]
    return uses, refusals


def history(asks: list[Ask], layout: Counter[str], since: float, until: float, max_wait_s: float) -> History:
    """What the host's registry holds at ``until`` having run ``layout`` since ``since``: only asks
    created before ``until`` exist, and each session and wait is cut there."""
    seen = [a for a in asks if since <= a.at < until]
    uses, refusals, _ = replay_layout(seen, layout, max_wait_s, until, "fit")
    return History("the trace's history weeks", since, until, since, uses=uses, refusals=refusals)


@dataclass(frozen=True)
class Score:
    asks: int
    refused: int  # refused at the first try
    lost: int  # refused and never granted within the wait
    waited_h: float  # hours asks spent waiting (granted or not)
    uncovered: int


def score(asks: list[Ask], layout: Counter[str], since: float, until: float, max_wait_s: float) -> Score:
    mine = [a for a in asks if since <= a.at < until]
    _, refusals, uncovered = replay_layout(mine, layout, max_wait_s, math.inf, "score")
    return Score(
        len(mine),
        len(refusals),
        sum(r.granted is None for r in refusals),
        sum(r.last_at - r.first_at for r in refusals) / 3600,
        uncovered,
    )
