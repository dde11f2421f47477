"""``bench/mig_suggest.py --trace PATH``: calque's ``suggest`` fitted on the trace's history weeks and
scored on the weeks after them (``mig_weeks.py`` holds the rules; this prints them and the table)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from calque.gpu.planner import current_layout
from calque.gpu.sim import SimGpu
from calque.gpu.suggest import suggest

from .institution import CARDS
from .mapping import DAY
from .mig_weeks import WEEK, Score, history, host_asks, score
from .trace import TraceError, read_tasks


def _fmt(layout: Counter[str]) -> str:
    return " + ".join(f"{n}x {p}" for p, n in sorted(layout.items()) if n)


def on_trace(a: argparse.Namespace) -> int:
    try:
        tasks = read_tasks(a.trace)
    except TraceError as exc:
        print(f"bench/mig_suggest.py: {exc}", file=sys.stderr)
        return 2
    if a.hosts < 1 or a.history_weeks < 1:
        print("bench/mig_suggest.py: --hosts and --history-weeks must be at least 1", file=sys.stderr)
        return 2
    asks = host_asks(tasks, a.hosts)
    since = a.fit_from_day * DAY
    fit_until = since + a.history_weeks * WEEK
    end = max((x.at for x in asks), default=fit_until) + 1
    wait = a.max_wait_min * 60
    with tempfile.TemporaryDirectory() as d:
        sim = SimGpu.create(Path(d) / "gpus.json", ["A100-40GB"] * len(CARDS), mig=True)
        for i, card in enumerate(CARDS):
            sim.create_instances(i, list(card))
        state = current_layout(sim)
    current = Counter(p for card in CARDS for p in card)
    print(f"trace: {a.trace} ({len(tasks)} tasks)")
    print(
        f"  the host: {len(CARDS)} A100-40GB cut {' | '.join('+'.join(c) for c in CARDS)}; it gets 1 in "
        f"{a.hosts} of the fractional-GPU tasks that ran, in arrival order ({len(asks)} asks in all)"
    )
    print("  an ask: creation time, run time (deletion - scheduled), the smallest slice the layout offers covering")
    print(f"  gpu_milli; refused asks wait up to {a.max_wait_min:g} min (checkout --wait), first come first served")
    print(
        f"  fitted: calque.gpu.suggest.suggest on the registry as it stands at day {fit_until / DAY:g} (days "
        f"{since / DAY:g}-{fit_until / DAY:g}, sessions and waits cut there)"
    )
    print(f"  scored: asks created on days {fit_until / DAY:g}-{end / DAY:.1f}, never seen by the fit, replayed on")
    print("  each layout from an empty host; a refused ask counts once, lost if no slice freed within its wait")
    t0 = time.perf_counter()
    s = suggest(state, history(asks, current, since, fit_until, wait), "trace-host")
    took = (time.perf_counter() - t0) * 1000
    suggested = sum((Counter(g.after) for g in s.gpus), Counter[str]())
    print(f"  current layout: {_fmt(current)}; suggested: {_fmt(suggested)} (suggest took {took:.0f} ms)")
    print(
        "  '7g|7g ref': both cards whole, picked by hand as a reference, not a contender (the trace's 7g share was "
        "read on day 130, inside the scored weeks)"
    )
    for r in s.reasons[:4]:
        print(f"    why: {r}")
    head = f"{'scored weeks':<22} {'layout':<10} {'asks':>5} {'refused':>8} {'lost':>6} {'wait h':>8}"
    print(head)
    print("-" * len(head))
    weeks = int((end - fit_until) // WEEK) + 1
    spans = [(fit_until + i * WEEK, min(end, fit_until + (i + 1) * WEEK)) for i in range(weeks)]
    spans = [(lo, hi) for lo, hi in spans if hi > lo]
    for lo, hi in [*spans, (fit_until, end)]:
        label = f"days {lo / DAY:.0f}-{hi / DAY:.0f}" + (" (all)" if (lo, hi) == (fit_until, end) else "")
        whole = Counter({"7g.40gb": len(CARDS)})  # a reference the fit never chose: both cards whole
        for name, layout in (("current", current), ("suggested", suggested), ("7g|7g ref", whole)):
            sc: Score = score(asks, layout, lo, hi, wait)
            print(f"{label:<22} {name:<10} {sc.asks:>5} {sc.refused:>8} {sc.lost:>6} {sc.waited_h:>8.1f}")
    return 0
