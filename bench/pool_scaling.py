"""Pool scaling benchmark, SYNTHETIC: an invented bursty day against ways of serving it (a simulation).

Superseded for the institution's figures by ``bench/replay/pools.py`` (a public production trace through
calque's own scaling code, scored on weeks its schedule never saw); kept as a quick what-if of the knobs.

The day: three bursts of 2,000 items (at 09:00, 13:00 and 17:00 UTC, each submitted over 5 minutes
as claims of 10 items), idle hours between and around them. Three ways to serve it:

(a) fixed: a pool sized for the peak, running all day, workers warm from the start: as many
    instances as a burst needs to clear within the pool's latency ask, ceil(claims per burst / target).
(b) backlog: calque's Auto Scaling policy (issue 10, section 3) with its real parameters: a wake step
    policy out of zero (visible messages, no instance in service), target tracking on backlog per
    instance with target = max(1, floor(latency_s / seconds_per_claim)) (undefined, so inactive,
    while no instance is in service), scale to zero after ``idle_s`` with nothing visible or in
    flight. Each new instance boots, then pays ``@enter`` once; it is billed from launch to
    termination.
(c) per-request containers at Modal's per-second GPU price: every claim gets a fresh container that
    pays a cold start (container start + the same ``@enter``) and then the claim's work, up to an
    assumed concurrency limit; billed for those seconds only.
(d) (b) with an EC2 warm pool (``calque_pool_warm: {state: Stopped, min_size: 2, max_prepared: 2}``,
    ReuseOnScaleIn; AWS keeps max(min_size, max_prepared - in service) warmed):
    scale-out starts a stopped, already bootstrapped instance (``warm_start_s``, then ``@enter`` from
    the local weight cache, ``warm_enter_s``) before it launches a cold one; scale-in stops instances
    back into the pool; the pool is refilled to min_size by a cold boot and the bootstrap up to ready
    (billed while it runs). A stopped instance bills its root EBS volume only. The pool is full at
    00:00 (a steady state: yesterday's instances).
(e) (d) with ``buffer_containers: 1`` in working hours: one instance beyond the backlog's need while
    the pool is active (``calque_pool_scaling.buffer`` / the script's knob), and a
    ``calque_pool_schedule`` window ``{at: "0 9 * * 1-5", duration: 8h30m, instances: 1, lead: 10m}``
    that keeps it in service between the day's bursts (08:50 to 17:30).
(f) (d) with scheduled warmth at the bursts' known times (``calque_pool_schedule`` entries
    ``{at: "0 9 * * *" (and 13, 17), duration: 10m, instances: 2, lead: 10m}``): the group's minimum
    is 2 from ten minutes before each burst for 20 minutes, started from the warm pool. Only a
    workload whose busy times are known ahead (a class, a nightly batch) can do this.

Reported per way: instance-hours (GPU container-hours for (c)), dollars, $/item and the p95 time to
first result (for each item: from its submission until its result is written; a claim's items are
written together), with ratios against (a). The EBS volumes of running instances are left out of
every row; only (d) and (e)'s stopped instances' volumes are counted (they are all a stopped
instance costs).

Prices (see ``PRICES`` below for the figures the run uses):

- EC2: g6.xlarge (1 x L4 24 GB), on-demand Linux us-east-1, from calque's rates table
  (``runtime/calque/data/ec2-rates.yaml``: source and ``as_of`` date printed with the table). A spot
  pool costs less; on-demand is the most it can cost.
- Modal: Nvidia L4 at $0.000222 per second ($0.7992/h), modal.com/pricing as quoted by the
  "Serverless GPU Pricing Matrix" cheat sheet at techbytes.app (prices verified there on 2026-05-07);
  not re-read from modal.com for this run. Modal also bills CPU and memory per second; they are left
  out, which favours (c).

Assumptions (all parameters of ``Scenario``; change them on the command line):

- one worker per instance (one GPU), 0.6 s per item, so 6 s per claim of 10 items on an L4;
- ``@enter`` (the model load) 60 s; an EC2 instance takes 180 s from launch to a started worker
  (boot, user-data, the wheelhouse install); a Modal container 10 s before ``@enter``;
- the pool asks for a 600 s latency; CloudWatch's 1-minute metrics and alarm evaluation put 60 s
  between the queue's state and a scaling action; ``idle_s`` 900 s; at most 10 instances;
- Modal: at most 10 GPU containers at once (assumed, a plan's GPU concurrency limit);
- claims are served first in, first out; no failures, retries or spot interruptions.
- warm start (d, e): ``warm_start_s`` 90 s from a stopped instance to a started worker. AWS says
  pre-initialised warm-pool instances "can be launched to serve traffic in as low as 30 seconds"
  (AWS Compute Blog, "Scaling your applications faster with EC2 Auto Scaling Warm Pools",
  2021-04-08, as reported by InfoQ 2021-05); a GPU instance loads its driver at each boot, so 90 s is
  assumed, not measured. ``warm_enter_s`` 30 s: ``@enter`` loading weights from the local cache
  instead of downloading them (an assumption; the cold ``@enter`` stays 60 s). Cold boot and
  bootstrap stay ``boot_s`` 180 s (boot, user-data, wheelhouse install) + ``enter_s`` 60 s (assumed,
  as for (b)).
- a stopped instance's root volume: 100 GiB gp3 (calque's default ``root_volume``) at $0.08 per
  GB-month in us-east-1 (aws.amazon.com/ebs/pricing; the long-standing US East list price, not
  re-read for this run, 2026-12-01), per second over a 730-hour month: $0.011 per stopped hour.

Run: .venv/bin/python bench/pool_scaling.py [--items-per-burst 2000] [--latency-s 600] ...
"""

from __future__ import annotations

import argparse
import heapq
import math
from dataclasses import dataclass, field, fields

from calque.aws.acquire import scaling
from calque.aws.pricing import rate, rates_table

INSTANCE_TYPE = "g6.xlarge"
MODAL_L4_USD_PER_S = 0.000222
MODAL_SOURCE = "modal.com/pricing via techbytes.app 'Serverless GPU Pricing Matrix', verified 2026-05-07"
DAY_S = 86_400


@dataclass
class Scenario:
    bursts_at_h: tuple[float, ...] = (9.0, 13.0, 17.0)
    items_per_burst: int = 2000
    burst_spread_s: float = 300.0
    batch_size: int = 10
    item_s: float = 0.6
    enter_s: float = 60.0
    boot_s: float = 180.0
    latency_s: float = 600.0
    metric_lag_s: float = 60.0
    idle_s: float = 900.0
    max_size: int = 10
    modal_start_s: float = 10.0
    modal_concurrency: int = 10
    warm_min: int = 2
    warm_max_prepared: int = 2
    warm_start_s: float = 90.0
    warm_enter_s: float = 30.0
    volume_gib: float = 100.0
    ebs_usd_per_gb_month: float = 0.08
    work_from_h: float = 8 + 50 / 60
    work_until_h: float = 17.5

    @property
    def seconds_per_claim(self) -> float:
        return self.batch_size * self.item_s


@dataclass
class Outcome:
    name: str
    instance_s: float
    usd: float
    items: int
    latencies: list[float] = field(default_factory=list)  # per item

    @property
    def usd_per_item(self) -> float:
        return self.usd / self.items

    @property
    def p95_s(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def backlog_target(latency_s: float, seconds_per_claim: float) -> tuple[int, str]:
    """The backlog-per-instance target from calque's own formula, and where it came from."""
    return scaling.backlog_target(latency_s, seconds_per_claim), "calque.aws.acquire.scaling.backlog_target"


def arrivals(sc: Scenario) -> list[float]:
    """Submission time of every claim of the day, in order."""
    per_burst = math.ceil(sc.items_per_burst / sc.batch_size)
    out: list[float] = []
    for start_h in sc.bursts_at_h:
        out += [start_h * 3600 + sc.burst_spread_s * i / per_burst for i in range(per_burst)]
    return out


def _items(sc: Scenario) -> int:
    return sc.items_per_burst * len(sc.bursts_at_h)


def fixed_pool(sc: Scenario, size: int, usd_per_h: float) -> Outcome:
    """(a): ``size`` warm workers all day; each claim goes to the first free one."""
    free = [0.0] * size  # when each worker is next free
    out = Outcome(f"(a) fixed, {size} instances all day", size * DAY_S, size * DAY_S / 3600 * usd_per_h, _items(sc))
    for t in arrivals(sc):
        start = max(t, heapq.heappop(free))
        done = start + sc.seconds_per_claim
        heapq.heappush(free, done)
        out.latencies += [done - t] * sc.batch_size
    return out


@dataclass
class Warmth:
    """What (d) and (e) add to (b): a warm pool of stopped instances, and a buffer in working hours."""

    label: str
    warm_min: int = 0
    buffer: int = 0  # instances beyond the backlog's need, inside the working-hours window
    windows: tuple[tuple[float, float, int], ...] = ()  # scheduled (from s, until s, minimum)


def backlog_policy(sc: Scenario, target: int, usd_per_h: float, warmth: Warmth | None = None) -> Outcome:
    """(b), (d), (e): the Auto Scaling group on the queue, simulated second by second."""
    w8 = warmth or Warmth("(b) calque backlog policy")
    pending = arrivals(sc)
    queue: list[float] = []  # submission times of claims not yet started
    workers: list[dict[str, float]] = []  # launched, ready (boot + enter), busy_until, terminated
    out = Outcome(f"{w8.label}, target {target}/instance", 0.0, 0.0, _items(sc))
    idle_since: float | None = 0.0
    samples: list[tuple[int, int, int]] = []  # (visible, in flight, in service), one a minute
    lag = max(1, round(sc.metric_lag_s / 60))  # the policies see the sample this many minutes old
    stopped = w8.warm_min  # the warm pool's stopped instances (full at 00:00)
    refills: list[float] = []  # when each instance bootstrapping into the warm pool is ready to stop
    stopped_s = 0.0  # stopped instance-seconds (EBS only)
    billed_refill_s = 0.0
    for now in range(DAY_S + 3 * 3600):
        while pending and pending[0] <= now:
            queue.append(pending.pop(0))
        live = [w for w in workers if w["terminated"] < 0]
        for w in live:
            if w["ready"] <= now and w["busy_until"] <= now and queue:
                t = queue.pop(0)
                w["busy_until"] = now + sc.seconds_per_claim
                out.latencies += [w["busy_until"] - t] * sc.batch_size
        stopped += sum(1 for r in refills if r <= now)
        refills = [r for r in refills if r > now]
        stopped_s += stopped
        in_flight = sum(1 for w in live if w["busy_until"] > now)
        if now % 60 == 0:  # a metric sample; the policies act on the one ``lag`` minutes old
            in_service_now = sum(1 for w in live if w["ready"] - sc.enter_s <= now)
            samples.append((len(queue), in_flight, in_service_now))
            visible, flying, in_service = samples[-1 - lag] if len(samples) > lag else (0, 0, 0)
            desired = len(live)
            if visible and not in_service:
                desired = max(desired, 1)  # the wake step policy: exact capacity 1
            working = sc.work_from_h * 3600 <= now % DAY_S < sc.work_until_h * 3600
            buffer = w8.buffer if working else 0
            if in_service:  # target tracking on (backlog + buffer x target) / in service
                desired = max(desired, math.ceil((visible + flying) / target) + buffer)
            if visible + flying == 0 and in_flight == 0 and not queue:
                idle_since = now if idle_since is None else idle_since
                if now - idle_since >= sc.idle_s:
                    desired = 0  # the idle step policy: exact capacity 0 (to min_size)
            else:
                idle_since = None
            scheduled = max([n for a, b, n in w8.windows if a <= now < b], default=0)
            desired = min(max(desired, buffer, scheduled), sc.max_size)  # the schedule's minimum holds
            for _ in range(desired - len(live)):
                if stopped:  # a warmed instance starts: no boot, no bootstrap, @enter from the cache
                    stopped -= 1
                    ready = now + sc.warm_start_s + sc.warm_enter_s
                else:
                    ready = now + sc.boot_s + sc.enter_s
                workers.append({"launched": now, "ready": ready, "busy_until": 0.0, "terminated": -1})
            for w in live[desired:] if desired < len(live) else []:
                w["terminated"] = now
                if w8.warm_min and stopped + len(refills) < max(w8.warm_min, sc.warm_max_prepared - desired):
                    stopped += 1  # ReuseOnScaleIn: back into the warm pool, stopped
            while w8.warm_min and stopped + len(refills) < w8.warm_min:  # the pool refills to min_size
                refills.append(now + sc.boot_s + sc.enter_s)
                billed_refill_s += sc.boot_s + sc.enter_s
    end = DAY_S + 3 * 3600
    out.instance_s = sum((w["terminated"] if w["terminated"] >= 0 else end) - w["launched"] for w in workers)
    out.instance_s += billed_refill_s
    ebs_usd = stopped_s * sc.volume_gib * sc.ebs_usd_per_gb_month / (730 * 3600)
    out.usd = out.instance_s / 3600 * usd_per_h + ebs_usd
    warm = sum(1 for w in workers if w["ready"] - w["launched"] < sc.boot_s)
    out.name += f", {len(workers)} starts ({warm} warm)" if w8.warm_min else f", {len(workers)} launches"
    if w8.warm_min:
        out.name += f", EBS ${ebs_usd:.2f}"
    return out


def per_request_containers(sc: Scenario, usd_per_s: float) -> Outcome:
    """(c): a fresh container per claim, cold start each time, at most ``modal_concurrency`` at once."""
    slots = [0.0] * sc.modal_concurrency
    billed = sc.modal_start_s + sc.enter_s + sc.seconds_per_claim
    out = Outcome(f"(c) per-request containers (Modal L4, <= {sc.modal_concurrency} at once)", 0.0, 0.0, _items(sc))
    for t in arrivals(sc):
        start = max(t, heapq.heappop(slots))
        done = start + billed
        heapq.heappush(slots, done)
        out.instance_s += billed
        out.latencies += [done - t] * sc.batch_size
    out.usd = out.instance_s * usd_per_s
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in fields(Scenario):
        if f.name != "bursts_at_h":
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    sc = Scenario(**{k: v for k, v in vars(parser.parse_args()).items()})
    row = rate(INSTANCE_TYPE)
    target, source = backlog_target(sc.latency_s, sc.seconds_per_claim)
    claims_per_burst = math.ceil(sc.items_per_burst / sc.batch_size)
    peak = min(sc.max_size, math.ceil(claims_per_burst / target))
    lead, window = 600.0, 600.0
    windows = tuple((h * 3600 - lead, h * 3600 + window, peak) for h in sc.bursts_at_h)
    results = [
        fixed_pool(sc, peak, row.usd_per_hour),
        backlog_policy(sc, target, row.usd_per_hour),
        per_request_containers(sc, MODAL_L4_USD_PER_S),
        backlog_policy(sc, target, row.usd_per_hour, Warmth("(d) backlog + warm pool (Stopped)", sc.warm_min)),
        backlog_policy(sc, target, row.usd_per_hour, Warmth("(e) (d) + buffer 1 in working hours", sc.warm_min, 1)),
        backlog_policy(
            sc, target, row.usd_per_hour, Warmth("(f) (d) + schedule at the bursts", sc.warm_min, 0, windows)
        ),
    ]
    base = results[0]
    print(
        "SYNTHETIC: an invented day and a simulation of the policy; row (f) is scheduled from the bursts' own times"
        " (foresight). On a real trace, warmth fitted on earlier weeks only: python -m bench.replay.pools"
    )
    print(
        f"A replayed day: {len(sc.bursts_at_h)} bursts x {sc.items_per_burst} items at {sc.bursts_at_h} h UTC, "
        f"claims of {sc.batch_size} items, {sc.seconds_per_claim:g} s per claim, @enter {sc.enter_s:g} s"
    )
    print(
        f"EC2 {INSTANCE_TYPE} ({row.gpu}) ${row.usd_per_hour}/h on-demand {rates_table().region}, as of {row.as_of} "
        f"({row.source}){' - uncertain: ' + row.uncertain if row.uncertain else ''}"
    )
    print(f"Modal L4 ${MODAL_L4_USD_PER_S}/s (${MODAL_L4_USD_PER_S * 3600:.4f}/h), {MODAL_SOURCE}; GPU only")
    print(
        f"backlog target {target} claims/instance = latency {sc.latency_s:g} s / {sc.seconds_per_claim:g} s per claim "
        f"(formula: {source}); idle {sc.idle_s:g} s, boot {sc.boot_s:g} s, metric lag {sc.metric_lag_s:g} s"
    )
    stopped_h = sc.volume_gib * sc.ebs_usd_per_gb_month / 730
    print(
        f"warm pool: {sc.warm_min} stopped, warm start {sc.warm_start_s:g} s + @enter from cache {sc.warm_enter_s:g} s "
        f"(cold: boot+bootstrap {sc.boot_s:g} s + @enter {sc.enter_s:g} s); stopped {sc.volume_gib:g} GiB gp3 at "
        f"${sc.ebs_usd_per_gb_month}/GB-month = ${stopped_h:.4f}/h each; working hours "
        f"{sc.work_from_h:.2f}-{sc.work_until_h:.2f} h"
    )
    print()
    head = f"{'strategy':<78} {'inst-h':>7} {'$/day':>8} {'$/item':>9} {'p95 s':>7} {'$/item vs a':>12} {'p95 vs a':>9}"
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r.name:<78} {r.instance_s / 3600:>7.2f} {r.usd:>8.2f} {r.usd_per_item:>9.5f} {r.p95_s:>7.0f} "
            f"{r.usd_per_item / base.usd_per_item:>11.3f}x {r.p95_s / base.p95_s:>8.2f}x"
        )


if __name__ == "__main__":
    main()
