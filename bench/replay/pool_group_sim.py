"""A pool's Auto Scaling group on the trace's claims, minute by minute: calque's scaling documents decide,
AWS's side (boot, warm start, target tracking's alarms, the scale-in choice) is modelled.

calque's own parts, imported and read, never restated: ``desired_scaling`` (the backlog policy's
TargetValue and metric expression, the wake and idle alarms' thresholds and periods, their step
policies' exact capacities), ``warm_pool_doc`` (the warm pool AWS is asked for) and the scheduled
actions ``recurring_actions`` writes (cron recurrences with a MinSize). An expression the model does
not know stops the run rather than being guessed (``ModelOutOfDate``).
"""

from __future__ import annotations

import math
import random
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from calque.aws.acquire.group_status import policy_names
from calque.aws.acquire.scaling import ScalingSettings, desired_scaling
from calque.aws.acquire.warm_pool import warm_pool_doc
from calque.models.pool_names import pool_names
from calque.models.warmth import WarmPoolSettings

from .pool_demand import Claim
from .pool_figures import EBS_USD_PER_STOPPED_H, Ends

TICK = 60.0
AZS = 3
HIGH_DATAPOINTS, LOW_DATAPOINTS, LOW_FRACTION = 3, 15, 0.9  # target tracking's alarms (pool_figures.AWS_DOCS)
WAKE_EXPR = "IF(FILL(inservice, 0) == 0 AND visible > 0, 1, 0)"
IDLE_EXPR = "FILL(visible, 0) + FILL(inflight, 0)"
POOL = "trace/whole-gpu"
Actions = dict[str, dict[str, Any]]


class ModelOutOfDate(Exception):
    """calque's scaling documents changed in a way this model does not evaluate."""


@dataclass
class Policy:
    """What the simulated group runs, read from calque's documents."""

    target: float
    buffer_claims: float  # the "+ N" of the backlog expression (buffer x target)
    wake_capacity: int
    idle_periods: int
    idle_capacity: int

    @classmethod
    def of(cls, settings: ScalingSettings) -> Policy:
        names = pool_names(POOL)
        doc = desired_scaling(names, settings)
        backlog_name, wake_name, idle_name = policy_names(names)
        backlog = doc.policies[backlog_name]["TargetTrackingConfiguration"]
        expr = backlog["CustomizedMetricSpecification"]["Metrics"][-1]["Expression"]
        m = re.fullmatch(r"\(visible \+ inflight(?: \+ (\d+))?\) / inservice", expr)
        wake, idle = doc.alarms[wake_name], doc.alarms[idle_name]
        if (
            m is None
            or wake["Metrics"][-1]["Expression"] != WAKE_EXPR
            or idle["Metrics"][-1]["Expression"] != IDLE_EXPR
            or wake["ComparisonOperator"] != "GreaterThanOrEqualToThreshold"
            or idle["ComparisonOperator"] != "LessThanOrEqualToThreshold"
            or (wake["Threshold"], idle["Threshold"]) != (1.0, 0.0)
        ):
            raise ModelOutOfDate("calque's backlog metric or alarms changed: update bench/replay/pool_group_sim.py")
        return cls(
            target=float(backlog["TargetValue"]),
            buffer_claims=float(m.group(1) or 0),
            wake_capacity=int(doc.policies[wake_name]["StepAdjustments"][0]["ScalingAdjustment"]),
            idle_periods=int(idle["EvaluationPeriods"]),
            idle_capacity=int(doc.policies[idle_name]["StepAdjustments"][0]["ScalingAdjustment"]),
        )


@dataclass(eq=False)  # instances are told apart by identity: two alike are still two
class Instance:
    since: float  # start of the current billed interval
    in_service: float
    ready: float  # the worker takes claims from here (after @enter)
    az: int
    busy_until: float = 0.0


@dataclass
class Result:
    name: str
    usd: float = 0.0
    ttfr: list[float] = field(default_factory=list)  # per claim scored, seconds
    starts: int = 0
    warm_starts: int = 0


@dataclass
class Group:
    """One run's configuration."""

    name: str
    policy: Policy | None  # None: a fixed pool of ``max_size``, in service from the start
    max_size: int
    min_size: int = 0
    warm: WarmPoolSettings | None = None
    schedule: Callable[[float], Actions] | None = None  # a week's start -> that week's scheduled actions


def _cron_fires(recurrence: str, t: float, day0: float) -> bool:
    minute, hour, _, _, dow = recurrence.split()
    s = t - day0
    return (
        int(minute) == int(s // 60) % 60
        and int(hour) == int(s // 3600) % 24
        and (dow == "*" or int(dow) == int(s // 86400) % 7)
    )


class _Sim:
    """One run's state; ``run`` below drives it tick by tick."""

    def __init__(self, g: Group, ends: Ends, t0: float, s0: float, s1: float, seed: int) -> None:
        self.g, self.e, self.t0, self.s0, self.s1 = g, ends, t0, s0, s1
        self.rng = random.Random(seed)
        self.out = Result(g.name)
        self.live: list[Instance] = []
        if g.policy is None:
            self.live = [Instance(t0, t0, t0, i % AZS) for i in range(g.max_size)]
        self.billed: list[tuple[float, float]] = []
        self.pool = warm_pool_doc(g.warm) if g.warm else None
        self.stopped, self.refills, self.stopped_s = 0, list[float](), 0.0
        self.samples: deque[tuple[int, int, int]] = deque(maxlen=64)
        self.lag = max(0, round(ends.metric_lag_s / TICK))
        self.high = self.low = self.idle = 0
        self.min_size, self.desired = g.min_size, len(self.live)
        self.actions: Actions = {}

    def serve(self, queue: deque[Claim], t: float, first_s: float) -> None:
        """Start every claim that can start before ``t``: first in, first out, on the worker free soonest."""
        while queue and self.live:
            c = queue[0]
            w = min(self.live, key=lambda i: max(i.ready, i.busy_until))
            start = max(w.ready, w.busy_until, c.arrival)
            if start >= t:
                return
            queue.popleft()
            w.busy_until = start + c.work
            if self.s0 <= c.arrival:
                self.out.ttfr.append(start - c.arrival + min(c.work, first_s))

    def scale(self, queue: deque[Claim], t: float) -> None:
        g, p = self.g, self.g.policy
        assert p is not None
        if g.schedule and (t - self.t0) % (7 * 86400) == 0:
            self.actions = g.schedule(t)
        for doc in self.actions.values():
            if _cron_fires(doc["Recurrence"], t, self.t0):
                self.min_size = int(doc["MinSize"])
        self.desired = min(g.max_size, max(self.min_size, self.decide(p, queue, t)))
        self.refill(t)
        if self.stopped:
            self.stopped_s += self.stopped * max(0.0, min(t + TICK, self.s1) - max(t, self.s0))
        while len(self.live) < self.desired:
            self.launch(t)
        for i in scale_in_choice(self.live, len(self.live) - self.desired, t, self.rng):
            self.live.remove(i)
            self.billed.append((i.since, t))
            pool = self.pool
            if pool and pool["InstanceReusePolicy"]["ReuseOnScaleIn"] and self.stopped < self.pool_size():
                self.stopped += 1  # stopped back into the warm pool, its weights still cached

    def launch(self, t: float) -> None:
        e = self.e
        az = min(range(AZS), key=lambda a: sum(i.az == a for i in self.live))  # AWS balances zones at launch
        if self.stopped:
            self.stopped -= 1
            self.live.append(Instance(t, t + e.warm_start_s, t + e.warm_start_s + e.warm_enter_s, az))
            self.out.warm_starts += 1
        else:
            svc = t + e.boot_s + e.bootstrap_s
            self.live.append(Instance(t, svc, svc + e.enter_s, az))
        self.out.starts += 1

    def decide(self, p: Policy, queue: deque[Claim], t: float) -> int:
        """The alarms and policies on the metric sample ``lag`` minutes old: AWS evaluating calque's documents."""
        desired = self.desired
        inflight = sum(i.busy_until > t for i in self.live)
        self.samples.append((len(queue), inflight, sum(i.in_service <= t for i in self.live)))
        visible, inflight, in_service = self.samples[-1 - self.lag] if len(self.samples) > self.lag else (0, 0, 0)
        if in_service:
            metric = (visible + inflight + p.buffer_claims) / in_service
            self.high = self.high + 1 if metric > p.target else 0
            self.low = self.low + 1 if metric < LOW_FRACTION * p.target else 0
            want = math.ceil(in_service * metric / p.target)
            if self.high >= HIGH_DATAPOINTS:
                desired = max(desired, want)
            elif self.low >= LOW_DATAPOINTS:
                desired, self.low = min(desired, want), 0
        else:
            self.high = self.low = 0
        if visible > 0 and in_service == 0:
            desired = p.wake_capacity  # the wake alarm's step policy: exact capacity
        self.idle = self.idle + 1 if visible + inflight <= 0 else 0
        if self.idle >= p.idle_periods:
            desired = p.idle_capacity  # the idle alarm's step policy: exact capacity (to min_size)
        return desired

    def pool_size(self) -> int:
        assert self.pool is not None
        prepared = int(self.pool.get("MaxGroupPreparedCapacity", self.g.max_size))
        return max(int(self.pool["MinSize"]), prepared - self.desired)

    def refill(self, t: float) -> None:
        """The warm pool kept at its size: instances launched, bootstrapped (weights into the cache), stopped."""
        if self.pool is None:
            return
        e = self.e
        self.stopped += sum(r <= t for r in self.refills)
        self.refills = [r for r in self.refills if r > t]
        size = self.pool_size()
        while self.stopped + len(self.refills) < size:
            self.refills.append(t + e.boot_s + e.bootstrap_s + e.enter_s)
            self.billed.append((t, self.refills[-1]))
        self.stopped = min(self.stopped, size)  # AWS terminates what is beyond the pool's size

    def result(self, queue: deque[Claim], pending: deque[Claim], usd_h: float, first_s: float) -> Result:
        s0, s1 = self.s0, self.s1
        billed = self.billed + [(i.since, s1) for i in self.live]
        run_s = sum(max(0.0, min(b, s1) - max(a, s0)) for a, b in billed)
        self.out.usd = run_s / 3600 * usd_h + self.stopped_s / 3600 * EBS_USD_PER_STOPPED_H
        # a claim not started by the end: its wait counted up to the end (censored)
        self.out.ttfr += [s1 - c.arrival + first_s for c in [*queue, *pending] if s0 <= c.arrival < s1]
        return self.out


def run(
    g: Group, claims: list[Claim], ends: Ends, t0: float, s0: float, s1: float, usd_h: float, first_s: float, seed: int
) -> Result:
    """Simulate [t0, s1); bill and score [s0, s1). ``t0`` falls on a week's start (the schedule's)."""
    sim = _Sim(g, ends, t0, s0, s1, seed)
    pending, queue = deque(claims), deque[Claim]()
    t = t0
    while t < s1:
        while pending and pending[0].arrival < t:
            queue.append(pending.popleft())
        sim.serve(queue, t, first_s)
        if g.policy is not None:
            sim.scale(queue, t)
        t += TICK
    sim.serve(queue, s1, first_s)
    return sim.result(queue, pending, usd_h, first_s)


def scale_in_choice(live: list[Instance], n: int, t: float, rng: random.Random) -> list[Instance]:
    """AWS's default termination policy among instances not protected (a worker holding a claim protects
    its instance): the Availability Zone with the most instances, then closest to the next billing hour,
    then at random. All instances share one launch template, so that criterion ties."""
    chosen: list[Instance] = []
    for _ in range(max(0, n)):
        free = [i for i in live if i.busy_until <= t and i not in chosen]
        if not free:
            break
        count = {a: sum(i.az == a for i in live if i not in chosen) for a in range(AZS)}
        top = max(count[i.az] for i in free)
        free = [i for i in free if count[i.az] == top]
        to_hour = min(3600 - (t - i.since) % 3600 for i in free)
        free = [i for i in free if 3600 - (t - i.since) % 3600 == to_hour]
        chosen.append(rng.choice(free))
    return chosen
