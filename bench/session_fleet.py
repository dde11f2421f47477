"""Session fleet benchmark: a class of elastic session hosts, scaled by calque's own documents.

On the trace (the default; ``--trace PATH``): the Alibaba GPU trace's fractional-GPU tasks as session
requests, ``bench/replay/fleet_sim.py`` (calque's ``desired_fleet_scaling`` read, AWS's boot and
scale-in choice modelled at both ends of cited ranges; every parameter printed at the top).
``--synthetic``: the older invented teaching week below (its first output line says so).

Synthetic: a replayed teaching week on one class of session hosts, three ways.

The class: ``teaching-rtx6000``, g7e.2xlarge hosts (one RTX PRO 6000 96 GB cut into 4 x 1g.24gb:
``slices_per_host`` 4), on-demand. The week (minute by minute, seeded):

- class-start bursts: a lab class's students each ask for a slice within its first ``burst_min``
  minutes (uniformly), and hold it for a log-normal time (median ``lab_median_min``, sigma 0.3) capped
  at the session TTL (``ttl_min``, 2 h): Monday 09:00 200 students, Tuesday 10:00 60, Wednesday
  09:00 120, Thursday 14:00 80, Friday 11:00 60 (``CLASSES``);
- daytime work: Poisson ``day_per_h`` an hour Monday-Friday 09-18, evenings ``evening_per_h``
  18-23 (homework), weekends ``weekend_per_h`` 10-18; log-normal sessions (median
  ``work_median_min``, sigma 0.8), capped at the TTL.

Every request waits in one first-in-first-out queue (the broker's, ``checkout --anywhere --wait``)
until a registered host has a free slice. Three ways to serve it:

(a) fixed: enough hosts for the week's peak of concurrent sessions (as if every request were granted
    at once), on all week;
(b) elastic, with the class's real policy (``calque.aws.acquire.fleet_scaling.FleetScalingSettings``,
    the parameters ``calque.gpu.session_fleet_scaling`` writes): the broker publishes
    ``UnservedRequests`` (queued longer than ``wait_s``, no free slice on a registered host) once a
    minute; the demand alarm (1 period of 60 s) fires the step policy in the next minute, which adds
    ``hosts_for(unserved)`` hosts (one per ``slices_per_host`` unserved requests, ``max_step`` at
    most) less those still warming (AWS's step scaling counts in-progress scale-out during
    ``EstimatedInstanceWarmup``); a host is billed from launch and serves ``boot_s`` later. Scale-in:
    one host fewer each minute the idle alarm is in ALARM (at least one host with no live session in
    every minute of ``idle_s``), ending an idle host (the longest idle): a host with a live session is
    protected; ``min_size`` 0, ``max_size`` ``max_hosts``;
(c) elastic with scheduled capacity (``calque_session_fleet_schedule``): (b) plus a raised minimum
    from ``lead_min`` before each class for ``window_min`` (``ceil(students / slices_per_host)`` hosts)
    and Monday-Friday 08:30-18:00 min 4 (``base_min_hosts``).

Reported per way: host-hours, dollars, slice-hours served, dollars per slice-hour served, the p95
and the longest wait for a slice, requests still waiting at the week's end; medians of ``seeds`` weeks.

Prices: g7e.2xlarge from calque's rates table (``runtime/calque/data/ec2-rates.yaml``: its source and
``as_of`` date are printed with the table; it marks the figure "uncertain": not read from AWS).
``../shared/data/gpu-catalog.yaml`` gives the card and its slices (4 x 1g.24gb, g7e) but no prices.

Boot time of a session host, ``boot_s`` 420 s from launch to registered with the broker: EC2 launch
to SSH is about 25-30 s for a Linux AMI (Colin Percival, "EC2 boot time benchmarking", daemonology.net,
2021-08-12: RunInstances 1.5 s + pending to running 4.9 s + running to port 22 open 22.8 s on
c5.xlarge; brevdev/ec2-coldboot-research: 25.8 s average cold launch to SSH, 2025); the rest is
assumed, not measured: a GPU AMI loading the NVIDIA driver, the user-data's wheelhouse install, munge,
the MIG layout (a GPU reset to enable MIG), the session daemon and the registration read by the
broker's next period (60 s). The same 420 s is the policy's ``EstimatedInstanceWarmup`` (``boot_s``).

Run: .venv/bin/python bench/session_fleet.py --trace ../shared/data/traces/alibaba-gpu-v2023-pods.csv
     .venv/bin/python bench/session_fleet.py --synthetic [--seeds 5] [--boot-s 420] [--idle-s 1200] ...
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

from calque.aws import pricing
from calque.aws.acquire.fleet_scaling import FleetScalingSettings

WEEK_MIN = 7 * 24 * 60
DAY = 24 * 60
INSTANCE = "g7e.2xlarge"
# (weekday 0 = Monday, start minute of the day, students)
CLASSES = [(0, 9 * 60, 200), (1, 10 * 60, 60), (2, 9 * 60, 120), (3, 14 * 60, 80), (4, 11 * 60, 60)]


@dataclass
class Scenario:
    slices_per_host: int = 4
    ttl_min: int = 120
    burst_min: int = 10
    lab_median_min: float = 100.0
    day_per_h: float = 6.0
    evening_per_h: float = 3.0
    weekend_per_h: float = 1.0
    work_median_min: float = 60.0
    wait_s: int = 120  # broker.yaml fleet.wait_s
    boot_s: int = 420
    idle_s: int = 1200
    max_step: int = 10
    max_hosts: int = 60
    lead_min: int = 15
    window_min: int = 135
    base_min_hosts: int = 4
    seeds: int = 5


@dataclass
class Host:
    launched: int
    ready: int
    ends: list[int] = field(default_factory=list)  # the end minute of each live session
    idle_since: int = 0
    gone: int | None = None


@dataclass
class Week:
    host_min: int = 0
    served_slice_min: int = 0
    waits: list[int] = field(default_factory=list)
    waiting_at_end: int = 0

    def p95(self) -> float:
        w = sorted(self.waits or [0])
        return float(w[min(len(w) - 1, math.ceil(0.95 * len(w)) - 1)])


def requests(sc: Scenario, seed: int) -> list[tuple[int, int]]:
    """(arrival minute, session minutes) for the week, sorted; the same for every way."""
    rng = random.Random(seed)
    out = []
    for day, start, students in CLASSES:
        for _ in range(students):
            at = day * DAY + start + rng.randrange(sc.burst_min)
            out.append((at, min(sc.ttl_min, max(5, round(rng.lognormvariate(math.log(sc.lab_median_min), 0.3))))))
    for minute in range(WEEK_MIN):
        d, t = divmod(minute, DAY)
        weekend = d % 7 >= 5
        rate = 0.0
        if not weekend and 9 * 60 <= t < 18 * 60:
            rate = sc.day_per_h
        elif not weekend and 18 * 60 <= t < 23 * 60:
            rate = sc.evening_per_h
        elif weekend and 10 * 60 <= t < 18 * 60:
            rate = sc.weekend_per_h
        for _ in range(_poisson(rng, rate / 60)):
            out.append((minute, min(sc.ttl_min, max(1, round(rng.lognormvariate(math.log(sc.work_median_min), 0.8))))))
    return sorted(out)


def _poisson(rng: random.Random, lam: float) -> int:
    n, p, limit = 0, 1.0, math.exp(-lam)
    while True:
        p *= rng.random()
        if p <= limit:
            return n
        n += 1


def peak_concurrency(reqs: list[tuple[int, int]]) -> int:
    delta = [0] * (WEEK_MIN + 400)
    for at, dur in reqs:
        delta[at] += 1
        delta[at + dur] -= 1
    now = peak = 0
    for d in delta:
        now += d
        peak = max(peak, now)
    return peak


def scheduled_minimum(sc: Scenario) -> list[int]:
    """The group's minimum each minute under (c)'s scheduled actions."""
    low = [0] * WEEK_MIN
    for day in range(5):
        for m in range(day * DAY + 8 * 60 + 30, day * DAY + 18 * 60):
            low[m] = max(low[m], sc.base_min_hosts)
    for day, start, students in CLASSES:
        need = min(sc.max_hosts, math.ceil(students / sc.slices_per_host))
        begin = day * DAY + start - sc.lead_min
        for m in range(begin, min(WEEK_MIN, begin + sc.window_min)):
            low[m] = max(low[m], need)
    return low


def simulate(sc: Scenario, reqs: list[tuple[int, int]], *, fixed: int | None, low: list[int] | None) -> Week:
    policy = FleetScalingSettings(
        slices_per_host=sc.slices_per_host, boot_s=sc.boot_s, idle_s=sc.idle_s, max_step=sc.max_step
    )
    boot_min = math.ceil(sc.boot_s / 60)
    wk = Week()
    hosts = [Host(0, 0) for _ in range(fixed or 0)]
    pending, queue = list(reqs), []  # queue: (arrival, minutes)
    add_next, idle_run = 0, 0
    for minute in range(WEEK_MIN):
        live = [h for h in hosts if h.gone is None]
        for h in live:
            h.ends = [e for e in h.ends if e > minute]
            if not h.ends and h.ready <= minute and h.idle_since < 0:
                h.idle_since = minute
        while pending and pending[0][0] <= minute:
            queue.append(pending.pop(0))
        ready = [h for h in live if h.ready <= minute]
        for h in ready:  # the broker: FIFO onto free slices (the emptiest host first is not modelled)
            while queue and len(h.ends) < sc.slices_per_host:
                at, dur = queue.pop(0)
                h.ends.append(minute + dur)
                h.idle_since = -1
                wk.waits.append(minute - at)
                wk.served_slice_min += dur
        wk.host_min += len(live)
        if fixed is not None:
            continue
        # the scaling action decided last minute (alarm evaluated once a minute, acted on the next)
        if add_next:
            for _ in range(min(add_next, sc.max_hosts - len(live))):
                hosts.append(Host(minute, minute + boot_min, idle_since=-1))
            add_next = 0
        live = [h for h in hosts if h.gone is None]
        floor = low[minute] if low else 0
        if len(live) < floor:  # a scheduled action raised the minimum: the group launches up to it
            for _ in range(floor - len(live)):
                hosts.append(Host(minute, minute + boot_min, idle_since=-1))
            live = [h for h in hosts if h.gone is None]
        unserved = sum(1 for at, _ in queue if (minute - at) * 60 >= sc.wait_s)
        warming = sum(1 for h in live if h.ready > minute)
        add_next = max(0, policy.hosts_for(unserved) - warming)
        idle = [h for h in live if h.ready <= minute and not h.ends]
        idle_run = idle_run + 1 if idle else 0
        if idle_run >= policy.idle_periods and len(live) > floor:
            victim = min(idle, key=lambda h: h.idle_since)  # unprotected: no live session
            victim.gone = minute
    wk.waiting_at_end = len(queue) + len(pending)
    return wk


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _on_trace(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench.replay importable
    from bench.replay.fleet_bench import on_trace

    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--trace", type=Path, required=True, help="alibaba cluster-trace-gpu-v2023 pods CSV")
    p.add_argument("--slices-per-host", type=int, default=2)
    p.add_argument("--fit-from-day", type=float, default=112.0)
    p.add_argument("--history-weeks", type=int, default=2)
    p.add_argument("--boot-s", type=int, default=420, help="the policy's EstimatedInstanceWarmup (calque's boot_s)")
    p.add_argument("--idle-s", type=int, default=1200)
    p.add_argument("--max-step", type=int, default=10)
    p.add_argument("--max-hosts", type=int, default=60)
    p.add_argument("--seed", type=int, default=0, help="AWS's random tie-break among equal idle hosts")
    return on_trace(p.parse_args(argv))


def main() -> None:
    if "--synthetic" not in sys.argv[1:]:
        raise SystemExit(_on_trace(sys.argv[1:]))
    sys.argv.remove("--synthetic")
    print("SYNTHETIC demand (--synthetic): an invented teaching week, not the trace")
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    for f in fields(Scenario):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    sc = Scenario(**vars(parser.parse_args()))
    rate = pricing.rate(INSTANCE)
    low = scheduled_minimum(sc)
    ways: dict[str, list[Week]] = {"(a) fixed": [], "(b) elastic": [], "(c) + schedule": []}
    peaks = []
    for seed in range(sc.seeds):
        reqs = requests(sc, seed)
        peak_hosts = math.ceil(peak_concurrency(reqs) / sc.slices_per_host)
        peaks.append(peak_hosts)
        ways["(a) fixed"].append(simulate(sc, reqs, fixed=peak_hosts, low=None))
        ways["(b) elastic"].append(simulate(sc, reqs, fixed=None, low=None))
        ways["(c) + schedule"].append(simulate(sc, reqs, fixed=None, low=low))
    n = len(requests(sc, 0))
    print(
        f"A replayed teaching week on {INSTANCE} hosts ({sc.slices_per_host} x 1g.24gb each): {n} requests in "
        f"seed 0's week, class bursts {', '.join(str(c[2]) for c in CLASSES)} students; medians of {sc.seeds} seeds"
    )
    print(
        f"price ${rate.usd_per_hour:.2f}/h on-demand ({rate.source}, as of {rate.as_of}"
        f"{'; uncertain: ' + rate.uncertain if rate.uncertain else ''})"
    )
    print(
        f"policy: a host per {sc.slices_per_host} requests unserved after {sc.wait_s}s, at most {sc.max_step} a "
        f"step, boot {sc.boot_s}s, scale-in after {sc.idle_s}s idle, max {sc.max_hosts}; "
        f"(a) {statistics.median(peaks):g} hosts for the peak; (c) class windows from {sc.lead_min} min before, "
        f"Mon-Fri 08:30-18:00 min {sc.base_min_hosts}"
    )
    print()

    def usd(w: Week) -> float:
        return w.host_min / 60 * rate.usd_per_hour

    rows = [
        ("host-hours", lambda w: w.host_min / 60, ".0f"),
        ("dollars", usd, ".0f"),
        ("slice-hours served", lambda w: w.served_slice_min / 60, ".0f"),
        ("$ per slice-hour served", lambda w: usd(w) / max(1e-9, w.served_slice_min / 60), ".2f"),
        ("wait for a slice, p95 (min)", lambda w: w.p95(), ".0f"),
        ("wait for a slice, longest (min)", lambda w: float(max(w.waits or [0])), ".0f"),
        ("still waiting at the week's end", lambda w: float(w.waiting_at_end), ".0f"),
    ]
    head = f"{'per week (median of seeds)':<34}" + "".join(f"{k:>16}" for k in ways) + f"{'(b)/(a)':>9}{'(c)/(a)':>9}"
    print(head)
    print("-" * len(head))
    for label, get, fmt in rows:
        vals = [_median([get(w) for w in weeks]) for weeks in ways.values()]
        ratios = "".join(f"{v / vals[0]:>8.2f}x" if vals[0] else f"{'-':>9}" for v in vals[1:])
        print(f"{label:<34}" + "".join(f"{v:>16{fmt}}" for v in vals) + ratios)


if __name__ == "__main__":
    main()
