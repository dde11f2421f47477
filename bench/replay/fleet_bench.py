"""``bench/session_fleet.py --trace PATH``: the session fleet on the trace's fractional-GPU tasks, rows
(a)-(c) of ``fleet_sim.py`` at both ends of the modelled ranges, scored on weeks no row was fitted on."""

from __future__ import annotations

import argparse
import math
import sys
import time

from calque.aws import pricing
from calque.ops.session_fleet_scaling import FleetScalingRequest

from .fleet_sim import CLASS, TICK, WAIT_S, FleetPolicy, run, summary, weekly_floor
from .mapping import DAY
from .pool_demand import WEEK, Claim, demand_by_hour, hour_of_week, week_of
from .pool_figures import AWS_DOCS, FIGURES, ends
from .trace import Task, TraceError, read_tasks

INSTANCE = "g7e.2xlarge"


def requests_of(tasks: list[Task]) -> list[Claim]:
    """Every fractional-GPU task that ran: one session request of one slice, arriving at its creation."""
    return sorted(
        (
            Claim(t.name, t.created, t.deleted - t.scheduled)
            for t in tasks
            if t.num_gpu == 1 and 0 < t.gpu_milli < 1000 and t.scheduled is not None and t.deleted is not None
        ),
        key=lambda c: c.arrival,
    )


def on_trace(a: argparse.Namespace) -> int:
    try:
        tasks = read_tasks(a.trace)
    except TraceError as exc:
        print(f"bench/session_fleet.py: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    reqs = requests_of(tasks)
    start = a.fit_from_day * DAY
    s0 = start + a.history_weeks * WEEK
    s1 = max(r.arrival for r in reqs) + 1
    slices = a.slices_per_host
    hist_peak = max(demand_by_hour(reqs, start, s0).values(), default=0)
    fixed = math.ceil(hist_peak / slices)
    # the module's options, validated as session_fleet_scaling validates them (ops/session_fleet_scaling.py)
    settings = FleetScalingRequest(
        fleet_class=CLASS, slices_per_host=slices, boot_s=a.boot_s, idle_s=a.idle_s, max_step=a.max_step
    ).settings()
    policy = FleetPolicy.of(settings)
    rate = pricing.rate(INSTANCE)
    floors = {
        w: weekly_floor(reqs, start, start + w * WEEK, slices, a.max_hosts)
        for w in range(week_of(s0, start), week_of(s1, start) + 1)
    }

    def floor_at(t: float) -> int:
        return floors[week_of(t, start)][hour_of_week(t, start)]

    print(f"trace: {a.trace} ({len(tasks)} tasks): {len(reqs)} fractional-GPU tasks that ran, one session each")
    print(
        f"  the class: {INSTANCE} hosts, one RTX PRO 6000 96 GB cut into {slices} slices; every fractional ask "
        "takes one slice (a 2g.48gb is 94 of the card's 188 SMs, about 0.87 of an A100's 108: it covers the "
        "trace's asks, up to 0.81 of an A100)"
    )
    print(
        f"  price ${rate.usd_per_hour:.2f}/h on demand ({rate.source}, as of {rate.as_of}"
        f"{'; uncertain: ' + rate.uncertain if rate.uncertain else ''})"
    )
    print(
        f"  history: days {start / DAY:g}-{s0 / DAY:g} (peak {hist_peak} sessions at once: (a) is {fixed} hosts); "
        f"scored: requests arriving days {s0 / DAY:g}-{s1 / DAY:.1f}, never seen by any fit"
    )
    print(
        f"  calque's documents (desired_fleet_scaling): demand alarm >= {policy.threshold:g} unserved over 1 period, "
        f"steps {[(lo, hi, n) for lo, hi, n in policy.steps[:3]]}..., warmup {policy.warmup_s:g} s; idle alarm "
        f"{policy.idle_periods} periods, -1 host; a request is unserved after wait_s {WAIT_S:g} s (the broker's "
        f"default); max {a.max_hosts} hosts"
    )
    print(
        "  (c): each scored week's minimum per hour of the week = the peak of sessions in progress that hour "
        "over the weeks before it, in hosts (fit_hour_of_week, as the pool replay's schedule)"
    )
    for k in ("boot_s", "bootstrap_s", "metric_lag_s"):
        f = FIGURES[k]
        print(f"  {k}: {f.fast:g} s fast, {f.slow:g} s slow: {f.source}")
    print("  registration: the broker's next 60 s read after the bootstrap")
    print(
        f"  scale-in: {AWS_DOCS['termination']}; here a session host with a live session is protected (calque "
        "session fleet protect)"
    )
    print(
        f"  waits are counted on the simulation's {TICK:g} s tick (a request is served at the next tick: up to 1 min)"
    )
    for e in ends():
        print(
            f"{e.name} end: a host registers {e.boot_s + e.bootstrap_s:g}-{e.boot_s + e.bootstrap_s + 60:g} s after "
            f"launch; metric lag {e.metric_lag_s:g} s"
        )
        rows = [
            run(f"(a) fixed, {fixed} hosts", reqs, slices, e, s0, s1, fixed=fixed),
            run("(b) elastic from zero", reqs, slices, e, s0, s1, policy=policy, max_hosts=a.max_hosts, seed=a.seed),
            run(
                "(c) (b) + hour-of-week minimum",
                reqs,
                slices,
                e,
                s0,
                s1,
                policy=policy,
                floor=floor_at,
                max_hosts=a.max_hosts,
                seed=a.seed,
            ),
        ]
        base = summary(rows[0], rate.usd_per_hour)
        head = (
            f"{'row':<34} {'host-h':>7} {'$':>7} {'$/slice-h':>9} {'wait p50':>9} {'p95':>8} {'p99':>8} "
            f"{'launches':>8} {'$ vs (a)':>8}"
        )
        print(head)
        print("-" * len(head))
        for o in rows:
            s = summary(o, rate.usd_per_hour)
            print(
                f"{o.name:<34} {s['host_h']:>7.0f} {s['usd']:>7.0f} {s['usd_per_slice_h']:>9.2f} {s['p50']:>8.1f}m "
                f"{s['p95']:>7.1f}m {s['p99']:>7.1f}m {s['launches']:>8} {s['usd'] / base['usd']:>7.3f}x"
            )
    print(f"({time.monotonic() - started:.0f} s to run)")
    return 0
