"""``python -m bench.replay --trace PATH``: the trace's fractional-GPU tasks, one window of it, replayed
through a real broker and real host daemons under each queue policy, side by side.

    .venv/bin/python -m bench.replay --trace ../shared/data/traces/alibaba-gpu-v2023-pods.csv \
        [--start-day 130 --days 1 --compression 720 --hosts 2 --shares ls=1,be=1 --holders booked] [--dry-run]

Runs as root (it makes one Unix user per lab and removes them after). ``--dry-run`` prints the choices
and the demand without starting anything.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

from .driver import LEAD_S, Outcome, replay
from .holders import HOLDER_WORDS, HOLDERS
from .institution import POLICIES, Shape
from .launch import institution, lab_users
from .mapping import LAB_OF_QOS, SEVENTHS, Window, choices, demand
from .report import allocation_ratio, reclaim_table, table
from .reserve import reserve
from .trace import TraceError, read_tasks

ANCHOR = (
    "anchor: large production schedulers report allocation ratios of 68-93 % (Alibaba's OSDI '26 GPU-cluster "
    "paper, as summarised publicly): thousands of whole GPUs shared by fractions, packed onto any card. Here a "
    "fixed MIG layout serves only asks of its slices' sizes, on a handful of cards: a slice of the wrong size "
    "serves nobody while a request waits for another"
)


def _shares(raw: str) -> dict[str, float]:
    out = {}
    for part in raw.split(","):
        lab, _, share = part.partition("=")
        if lab not in LAB_OF_QOS.values():
            labs = ", ".join(sorted(set(LAB_OF_QOS.values())))
            raise argparse.ArgumentTypeError(f"no lab {lab!r}: the labs are {labs}")
        out[lab] = float(share)
        if out[lab] <= 0:
            raise argparse.ArgumentTypeError(f"lab {lab}'s share must be positive")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, required=True, help="alibaba cluster-trace-gpu-v2023 pods CSV")
    ap.add_argument("--start-day", type=float, default=130.0)
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--compression", type=float, default=720.0, help="trace seconds per replay second")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--shares", type=_shares, default={"ls": 1.0, "be": 1.0})
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated, from: " + ", ".join(POLICIES))
    ap.add_argument("--holders", choices=HOLDERS, default="booked", help="the holder model (bench/replay/holders.py)")
    ap.add_argument(
        "--grace",
        type=float,
        default=0.0,
        help="replay seconds a request queued at the window's end may wait on for its grant (tests; 0 for figures)",
    )
    ap.add_argument("--dry-run", action="store_true", help="print the choices and the demand; start nothing")
    a = ap.parse_args(argv)
    policies = [p for p in a.policies.split(",") if p]
    if bad := [p for p in policies if p not in POLICIES]:
        ap.error(f"unknown policy {bad[0]!r}: choose from {', '.join(POLICIES)}")
    if a.compression <= 0 or a.days <= 0 or a.hosts < 1:
        ap.error("--compression and --days must be positive, --hosts at least 1")
    window = Window(a.start_day, a.days, a.compression)
    shape = Shape(a.hosts, {lab: a.shares.get(lab, 1.0) for lab in dict.fromkeys(LAB_OF_QOS.values())})
    try:
        tasks = read_tasks(a.trace)
    except TraceError as exc:
        print(f"bench.replay: {exc}", file=sys.stderr)
        return 2
    d = demand(tasks, window, shape.offered, a.holders)
    print(f"trace: {a.trace} ({len(tasks)} tasks)")
    holder = f"holders ({a.holders}; --holders {'|'.join(HOLDERS)}): {HOLDER_WORDS[a.holders]}"
    for line in [*choices(window, shape.offered), holder, *shape.lines(window)]:
        print("  " + line)
    load = sum(r.hold * SEVENTHS[r.profile] for r in d.requests) / (window.replay_s * shape.sevenths)
    kept = sum(max(r.hold, r.booked) * SEVENTHS[r.profile] for r in d.requests) / (window.replay_s * shape.sevenths)
    print(
        f"demand: {len(d.requests)} requests replayed; offered load {100 * load:.0f} % of the institution's compute "
        f"busy, {100 * kept:.0f} % held as the holders would hold it without reclaim"
    )
    print("  by lab: " + ", ".join(f"{k} {v}" for k, v in sorted(Counter(r.lab for r in d.requests).items())))
    print("  by slice: " + ", ".join(f"{k} {v}" for k, v in sorted(Counter(r.profile for r in d.requests).items())))
    print("  set aside: " + ", ".join(f"{k} {v}" for k, v in d.set_aside.most_common()))
    if a.dry_run:
        return 0
    if os.geteuid() != 0:
        print("bench.replay: run as root (it makes one Unix user per lab, and runs the daemons)", file=sys.stderr)
        return 2
    results: dict[str, list[Outcome]] = {}
    with lab_users(list(shape.shares)) as users:
        for policy in policies:
            started = time.monotonic()
            with institution(shape, window, policy, users) as running:
                if policy == "fair-reserve":
                    reserve(running.broker_socket, users, window, LEAD_S)
                results[policy] = replay(
                    running.broker_socket, users, d.requests, window.replay_s, running.hosts, a.grace
                )
            print(f"  {policy}: replayed in {time.monotonic() - started:.0f} s", flush=True)
    print()
    print("waits in trace minutes (replay seconds x compression); alloc % = allocated compute / the institution's")
    print("while requests waited; got % = a lab's share of it then, beside its configured share. A replay second")
    rtt_min = 0.02 * a.compression / 60
    print(f"is {a.compression:g} trace seconds: the broker's own round trip (~20 ms) shows as ~{rtt_min:.1f} trace min")
    for line in table(results, window.replay_s, a.compression, shape.sevenths, shape.shares):
        print(line)
    print()
    print(f"idle time (trace slice-hours; holders {a.holders}): held idle after the work ended, and what reclaim")
    print("ended of it before the TTL; sessions ended by reclaim, and of them those whose holder was still busy")
    for line in reclaim_table(results, window.replay_s, a.compression):
        print(line)
    print()
    print(ANCHOR)
    ratios = ", ".join(
        f"{p} {100 * allocation_ratio(o, window.replay_s, shape.sevenths)[0]:.1f} %" for p, o in results.items()
    )
    print(f"this institution's allocation ratio while requests waited: {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
