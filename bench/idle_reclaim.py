"""Idle reclaim benchmark: the real host daemons' idle reclaim on the trace's demand, reclaim off and on.

On the trace (the default; ``--trace PATH``, as root): ``bench/replay``'s session replay with two
policies, fair share with reclaim off and on (``--policies fair,fair-reclaim``): real ``calque session
serve`` daemons reclaim by the simulated utilisation the replayed holders set from the trace's run times
(``bench/replay/holders.py``); every other ``bench.replay`` option passes through (``--holders prompt``
for the other end of the holder model). ``--synthetic``: the older re-implementation below, on an
invented week (its first output line says so).

Synthetic: a simulated week of notebook sessions on one teaching host, reclaim off and on.

The host: ``slices`` MIG slices (default 14: two H100 80GB cut into 7 x 1g.10gb). Requests arrive
as a Poisson stream, ``weekday_per_h`` an hour from 09:00 to 18:00 Monday to Friday and
``weekend_per_h`` from 10:00 to 16:00 at the weekend; a request that finds no free slice waits in
one first-in-first-out queue (``calque session checkout --wait``) until one frees. Every session
asks the default TTL (``ttl_min``, 4 h, the longest a lab session may last). Two kinds of holder:

- an *idle notebook* (``idle_share`` of requests): works for ``notebook_active_min`` (10 min), then
  goes quiet and never checks in: it holds its slice until the TTL ends;
- a *worker*: works for a log-normal time (median ``work_median_min``, 60 min, sigma 0.8, capped at
  the TTL) and checks in; ``pause_share`` of them pause once halfway for an exponential time (mean
  ``pause_mean_min``, 20 min: lunch, a meeting) with the slice idle, and come back.

With reclaim on (``idle: {for: 30m, memory_from: null}``, the daemon's rule in
``calque.session.daemon.activity``; under the default ``memory_from: 64MiB`` a quiet notebook that keeps
a CUDA context open is active and never reclaimed) a session whose slice stays idle for
``idle_for_min`` ends then: a notebook after its activity plus
30 min; a worker whose pause reaches 30 min loses its session then (counted as *lost in a pause*,
the cost of reclaim: that holder would have come back). The warn notice, sampling (1 s) and the
reclaim's own seconds are left out; every time is in whole minutes.

Reported per mode: slice-hours held (and how many of them idle), free slice-hours in working hours
(weekdays 09-18: what others could have had), the mean and p95 queue wait of the requests granted,
requests still waiting at the week's end, sessions reclaimed, and sessions lost in a pause; the
medians over ``seeds`` seeded weeks, with reclaim on / off as a ratio.

Run: .venv/bin/python bench/idle_reclaim.py [--idle-share 0.4] [--weekday-per-h 8] [--seeds 5] ...
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import dataclass, fields
from pathlib import Path

WEEK_MIN = 7 * 24 * 60


@dataclass
class Scenario:
    slices: int = 14
    weekday_per_h: float = 8.0
    weekend_per_h: float = 1.0
    ttl_min: int = 240
    idle_share: float = 0.4
    notebook_active_min: int = 10
    work_median_min: float = 60.0
    pause_share: float = 0.2
    pause_mean_min: float = 20.0
    idle_for_min: int = 30
    seeds: int = 5


@dataclass
class Request:
    at: int
    active: list[tuple[int, int]]  # busy spells (from, until) in minutes after the grant
    ends: int  # minutes after the grant when the holder checks in (or the TTL ends)


@dataclass
class Week:
    held_h: float = 0.0
    idle_held_h: float = 0.0
    free_working_h: float = 0.0
    waits: list[int] | None = None
    waiting_at_end: int = 0
    reclaimed: int = 0
    lost_in_pause: int = 0

    def wait_mean(self) -> float:
        return statistics.fmean(self.waits) if self.waits else 0.0

    def wait_p95(self) -> float:
        w = sorted(self.waits or [0])
        return float(w[min(len(w) - 1, math.ceil(0.95 * len(w)) - 1)])


def _working(minute: int) -> bool:
    day, t = divmod(minute, 24 * 60)
    return day % 7 < 5 and 9 * 60 <= t < 18 * 60


def requests(sc: Scenario, seed: int) -> list[Request]:
    """The week's requests, the same for both modes (one seed, one week)."""
    rng = random.Random(seed)
    out = []
    for minute in range(WEEK_MIN):
        day, t = divmod(minute, 24 * 60)
        rate = sc.weekday_per_h if day % 7 < 5 and 9 * 60 <= t < 18 * 60 else 0.0
        if day % 7 >= 5 and 10 * 60 <= t < 16 * 60:
            rate = sc.weekend_per_h
        for _ in range(_poisson(rng, rate / 60)):
            if rng.random() < sc.idle_share:
                out.append(Request(minute, [(0, sc.notebook_active_min)], sc.ttl_min))
                continue
            work = min(sc.ttl_min, max(1, round(rng.lognormvariate(math.log(sc.work_median_min), 0.8))))
            if rng.random() < sc.pause_share and work >= 2:
                pause = max(1, round(rng.expovariate(1 / sc.pause_mean_min)))
                half = work // 2
                spells = [(0, half), (half + pause, work + pause)]
                out.append(Request(minute, spells, min(sc.ttl_min, work + pause)))
            else:
                out.append(Request(minute, [(0, work)], work))
    return out


def _poisson(rng: random.Random, lam: float) -> int:
    n, p, limit = 0, 1.0, math.exp(-lam)
    while True:
        p *= rng.random()
        if p <= limit:
            return n
        n += 1


def reclaim_end(r: Request, idle_for: int) -> tuple[int, bool]:
    """When a session ends under idle reclaim, and whether it was a worker's pause that ended it."""
    last = 0  # the idle clock starts at the grant
    for start, until in r.active:
        if start - last >= idle_for and start < r.ends:
            return last + idle_for, True  # idle long enough before this spell began
        last = until
    return min(r.ends, last + idle_for), False


def simulate(sc: Scenario, reqs: list[Request], reclaim: bool) -> Week:
    wk = Week(waits=[])
    queue: list[Request] = []
    pending = list(reqs)
    holders: list[tuple[int, Request, int]] = []  # (ends at, request, granted at)
    free = sc.slices
    for minute in range(WEEK_MIN):
        for h in [h for h in holders if h[0] <= minute]:
            holders.remove(h)
            free += 1
        while pending and pending[0].at <= minute:
            queue.append(pending.pop(0))
        while free and queue:
            r = queue.pop(0)
            free -= 1
            end = r.ends
            if reclaim:
                end, in_pause = reclaim_end(r, sc.idle_for_min)
                if end < r.ends:
                    wk.reclaimed += 1
                    wk.lost_in_pause += int(in_pause and len(r.active) > 1)
            holders.append((minute + end, r, minute))
            wk.waits.append(minute - r.at)  # type: ignore[union-attr]
            busy = sum(max(0, min(u, end) - s) for s, u in r.active)
            wk.held_h += end / 60
            wk.idle_held_h += (end - busy) / 60
        if _working(minute):
            wk.free_working_h += free / 60
    wk.waiting_at_end = len(queue) + len(pending)
    return wk


def _median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    if "--synthetic" not in sys.argv[1:]:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench.replay importable
        from bench.replay.__main__ import main as replay

        args = sys.argv[1:]
        print("idle reclaim on the trace: bench.replay, fair share with the hosts' idle reclaim off and on")
        raise SystemExit(
            replay(
                [*args, *([] if any(a.startswith("--policies") for a in args) else ["--policies", "fair,fair-reclaim"])]
            )
        )
    sys.argv.remove("--synthetic")
    print("SYNTHETIC demand (--synthetic): an invented week and a re-implementation of the rule, not the daemon")
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    for f in fields(Scenario):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    sc = Scenario(**vars(parser.parse_args()))
    off_weeks, on_weeks = [], []
    for seed in range(sc.seeds):
        reqs = requests(sc, seed)
        off_weeks.append(simulate(sc, reqs, reclaim=False))
        on_weeks.append(simulate(sc, reqs, reclaim=True))
    n = len(requests(sc, 0))
    print(
        f"A simulated week on {sc.slices} slices: {sc.weekday_per_h:g} requests/h weekdays 09-18, "
        f"{sc.weekend_per_h:g}/h weekends 10-16 ({n} requests in seed 0's week), TTL {sc.ttl_min} min"
    )
    print(
        f"{sc.idle_share:.0%} idle notebooks (busy {sc.notebook_active_min} min, then quiet until the TTL); "
        f"workers: log-normal work, median {sc.work_median_min:g} min; {sc.pause_share:.0%} pause once "
        f"(mean {sc.pause_mean_min:g} min); reclaim after {sc.idle_for_min} idle min; medians of {sc.seeds} seeds"
    )
    print()
    rows = [
        ("slice-hours held", lambda w: w.held_h, ".1f"),
        ("  of which idle", lambda w: w.idle_held_h, ".1f"),
        ("free slice-hours, weekdays 09-18", lambda w: w.free_working_h, ".1f"),
        ("queue wait, mean (min)", lambda w: w.wait_mean(), ".1f"),
        ("queue wait, p95 (min)", lambda w: w.wait_p95(), ".0f"),
        ("still waiting at the week's end", lambda w: float(w.waiting_at_end), ".0f"),
        ("sessions reclaimed as idle", lambda w: float(w.reclaimed), ".0f"),
        ("  of which a worker's pause", lambda w: float(w.lost_in_pause), ".0f"),
    ]
    head = f"{'per week (median of seeds)':<36} {'reclaim off':>12} {'reclaim on':>12} {'on / off':>9}"
    print(head)
    print("-" * len(head))
    for label, get, fmt in rows:
        off = _median([get(w) for w in off_weeks])
        on = _median([get(w) for w in on_weeks])
        ratio = f"{on / off:>8.3f}x" if off else f"{'-':>9}"
        print(f"{label:<36} {off:>12{fmt}} {on:>12{fmt}} {ratio}")


if __name__ == "__main__":
    main()
