"""``bench/session_fleet.py`` on the trace (issue 37 part 5): a class of elastic session hosts serving the
trace's fractional-GPU tasks, scaled by calque's own scaling documents, AWS's side modelled.

calque's own, imported and read, never restated: ``desired_fleet_scaling`` (the demand alarm's
threshold and periods, its step policy's StepAdjustments and EstimatedInstanceWarmup, the idle alarm's
periods and its -1 step) under ``FleetScalingSettings``, and the broker's ``wait_s`` default
(``DemandSettings``: a request queued longer counts as unserved demand). Modelled (AWS): launch to a
booted OS and the host's bootstrap (``pool_figures.FIGURES``, both ends), registration at the broker's
next 60 s read, the metric's lag, step scaling counting hosts still warming against a step
(EstimatedInstanceWarmup), and scale-in per the group's default termination policy among hosts not
protected (a host with a live session protects itself: ``calque session fleet protect``):
``pool_group_sim.scale_in_choice``. Rows: (a) a fixed class sized to the history weeks' peak; (b)
elastic from zero; (c) (b) with an hour-of-week minimum fitted, each week, on the weeks before it only.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from calque.aws.acquire.fleet_scaling import FleetScalingSettings, desired_fleet_scaling, policy_names
from calque.models.fleet import DemandSettings, fleet_pool
from calque.models.pool_names import pool_names

from .pool_demand import WEEK, Claim, fit_hour_of_week
from .pool_figures import Ends
from .pool_group_sim import AZS, ModelOutOfDate, scale_in_choice
from .pool_group_sim import Instance as _Instance

TICK = 60.0
CLASS = "trace-frac"
WAIT_S = float(DemandSettings.model_fields["wait_s"].default)


@dataclass(frozen=True)
class FleetPolicy:
    """What the simulated group runs, read from calque's documents for the class."""

    warmup_s: float
    threshold: float
    steps: tuple[tuple[float, float, int], ...]  # (lower, upper, hosts added) relative to the threshold
    idle_periods: int

    @classmethod
    def of(cls, s: FleetScalingSettings) -> FleetPolicy:
        names = pool_names(fleet_pool(CLASS))
        doc = desired_fleet_scaling(names, CLASS, s)
        demand, idle = policy_names(names)
        alarm, idle_alarm = doc.alarms[demand], doc.alarms[idle]
        if alarm["EvaluationPeriods"] != 1 or alarm["ComparisonOperator"] != "GreaterThanOrEqualToThreshold":
            raise ModelOutOfDate(f"the demand alarm changed: {alarm}")
        if doc.policies[idle]["StepAdjustments"] != [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": -1}]:
            raise ModelOutOfDate(f"the idle policy changed: {doc.policies[idle]}")
        steps = tuple(
            (x["MetricIntervalLowerBound"], x.get("MetricIntervalUpperBound", math.inf), x["ScalingAdjustment"])
            for x in doc.policies[demand]["StepAdjustments"]
        )
        return cls(
            doc.policies[demand]["EstimatedInstanceWarmup"], alarm["Threshold"], steps, idle_alarm["EvaluationPeriods"]
        )

    def adds(self, unserved: float) -> int:
        """AWS step scaling: the step whose interval holds metric - threshold (lower inclusive)."""
        breach = unserved - self.threshold
        if breach < 0:
            return 0
        return next((n for lo, hi, n in self.steps if lo <= breach < hi), 0)


@dataclass(eq=False)
class Host(_Instance):
    launched: float = 0.0
    sessions: list[float] = field(default_factory=list)  # end times of its live sessions


@dataclass
class Outcome:
    name: str
    host_s: float = 0.0
    served_s: float = 0.0
    waits: list[float] = field(default_factory=list)  # seconds, requests arriving in the scored span
    waiting_at_end: int = 0
    launches: int = 0


def _ready(t: float, e: Ends) -> float:
    """Launch -> registered: boot and bootstrap (modelled), then the broker's next 60 s read."""
    up = t + e.boot_s + e.bootstrap_s
    return math.ceil(up / 60) * 60


def run(
    name: str,
    reqs: list[Claim],
    slices: int,
    e: Ends,
    s0: float,
    s1: float,
    *,
    fixed: int = 0,
    policy: FleetPolicy | None = None,
    floor: Callable[[float], int] | None = None,
    max_hosts: int = 200,
    seed: int = 0,
) -> Outcome:
    """Requests arriving in [s0, s1): every one waits in the broker's FIFO queue for a free slice."""
    rng = random.Random(seed)
    out = Outcome(name)
    hosts: list[Host] = [Host(s0, s0, s0, i % AZS, launched=s0) for i in range(fixed)]
    pending = deque(r for r in reqs if s0 <= r.arrival < s1)
    queue: deque[Claim] = deque()
    lagged: deque[tuple[float, float]] = deque()  # (at, unserved) as the metric saw it
    idle_run = 0
    t = s0
    while t < s1:
        for h in hosts:
            h.sessions = [x for x in h.sessions if x > t]
            h.busy_until = max(h.sessions, default=0.0)
        while pending and pending[0].arrival <= t:
            queue.append(pending.popleft())
        for h in hosts:  # the broker grants in arrival order onto registered hosts with a free slice
            while queue and h.ready <= t and len(h.sessions) < slices:
                r = queue.popleft()
                h.sessions.append(t + r.work)
                h.busy_until = max(h.sessions)
                out.waits.append(t - r.arrival)
                out.served_s += min(r.work, s1 - t)
        if policy is not None:
            low = floor(t) if floor else 0
            _scale(policy, hosts, queue, lagged, t, e, low, max_hosts, rng, out)
            live_idle = [h for h in hosts if h.ready <= t and not h.sessions]
            idle_run = idle_run + 1 if live_idle else 0
            if idle_run >= policy.idle_periods and len(hosts) > low:  # the idle alarm in ALARM: one host less
                for gone in scale_in_choice(list(live_idle), 1, t, rng):
                    h = next(x for x in live_idle if x is gone)
                    hosts.remove(h)
                    out.host_s += t - h.launched
        t += TICK
    out.host_s += sum(s1 - h.launched for h in hosts)
    out.waits += [s1 - r.arrival for r in queue]  # still queued at the end: waited until it
    out.waiting_at_end = len(queue) + len(pending)
    return out


def _scale(
    p: FleetPolicy,
    hosts: list[Host],
    queue: deque[Claim],
    lagged: deque[tuple[float, float]],
    t: float,
    e: Ends,
    low: int,
    max_hosts: int,
    rng: random.Random,
    out: Outcome,
) -> None:
    lagged.append((t, float(sum(1 for r in queue if t - r.arrival >= WAIT_S))))
    seen = 0.0
    while lagged and lagged[0][0] <= t - e.metric_lag_s:
        seen = lagged.popleft()[1]
    warming = sum(1 for h in hosts if t - h.launched < p.warmup_s)
    want = max(0, p.adds(seen) - warming)  # hosts in warmup count against a step (EstimatedInstanceWarmup)
    want = max(want, low - len(hosts))  # a scheduled minimum: the group launches up to it
    for _ in range(min(want, max_hosts - len(hosts))):
        hosts.append(Host(t, _ready(t, e), _ready(t, e), rng.randrange(AZS), launched=t))
        out.launches += 1


def weekly_floor(reqs: list[Claim], start: float, week_start: float, slices: int, cap: int) -> list[int]:
    """Each hour of the week's minimum hosts: the history's peak of requests in progress that hour
    (the weeks before ``week_start`` only), in hosts."""
    peaks = fit_hour_of_week(reqs, start, week_start, 1.0, 0, cap * slices)
    return [math.ceil(x / slices) for x in peaks]


def summary(o: Outcome, usd_h: float) -> dict[str, Any]:
    w = sorted(o.waits) or [0.0]

    def q(x: float) -> float:
        return w[min(len(w) - 1, max(0, math.ceil(x * len(w)) - 1))] / 60

    usd = o.host_s / 3600 * usd_h
    return {
        "host_h": o.host_s / 3600,
        "usd": usd,
        "usd_per_slice_h": usd / max(1e-9, o.served_s / 3600),
        "p50": q(0.5),
        "p95": q(0.95),
        "p99": q(0.99),
        "waiting": o.waiting_at_end,
        "launches": o.launches,
    }


__all__ = ["WEEK", "FleetPolicy", "Outcome", "run", "summary", "weekly_floor"]
