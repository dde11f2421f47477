"""A pool's usage: its instances' seconds, split into busy (claims) and warm-idle.

Busy seconds are the claims' own (``Summary.claim_seconds``, written by the workers, inside the
window by the claim's start and end); instance-seconds come from the instances' own usage records
(``ledger/instance_records.py``: written at boot, by each worker and on the termination hook, kept
in the pool's bucket), never from what EC2 still lists, which forgets a terminated instance within
about an hour.
Per instance type, warm-idle = instance-seconds - busy seconds (never below 0): an instance up and
serving nothing is paid on EC2 and would cost nothing on Modal. One worker per instance is assumed
(a cloud pool's shape): claims of several workers on one instance would count its seconds twice.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from calque.aws.store import RunStore
from calque.errors import UsageError
from calque.ledger.events import Window, pool_event
from calque.ledger.instance_records import InstanceSpan, disagreements, instance_spans, read_records, scaling_activities
from calque.models import PoolSpec, Summary
from calque.models.ledger import UsageEvent


def pool_usage(
    pool: str, summaries: Iterable[Summary], instances: Iterable[InstanceSpan], window: Window
) -> list[UsageEvent]:
    """The pool's busy and warm-idle events in ``window``, one pair per instance type."""
    up: dict[str, float] = {}
    busy: dict[str, float] = {}
    bounds: dict[str, tuple[float, float]] = {}
    spot: dict[str, float | None] = {}

    def widen(t: str, a: float, b: float) -> None:
        lo, hi = bounds.get(t, (a, b))
        bounds[t] = (min(lo, a), max(hi, b))

    for inst in instances:
        clipped = window.clip(inst.started, inst.ended if inst.ended is not None else window.until)
        if clipped is None:
            continue
        up[inst.instance_type] = up.get(inst.instance_type, 0.0) + clipped[1] - clipped[0]
        spot.setdefault(inst.instance_type, inst.spot_usd_per_hour)
        widen(inst.instance_type, *clipped)
    for s in summaries:
        if not s.instance_type:
            continue
        start, end = s.started_at.timestamp(), s.finished_at.timestamp()
        clipped = window.clip(start, end)
        if clipped is None:
            continue
        share = (clipped[1] - clipped[0]) / (end - start) if end > start else 1.0
        busy[s.instance_type] = busy.get(s.instance_type, 0.0) + s.claim_seconds * share
        widen(s.instance_type, *clipped)
    events: list[UsageEvent] = []
    for t in sorted(set(up) | set(busy)):
        a, b = bounds[t]
        b_s = min(busy.get(t, 0.0), up[t]) if t in up else busy.get(t, 0.0)
        events.append(pool_event("pool-busy", pool, t, a, b, b_s, spot.get(t)))
        idle = max(0.0, up.get(t, 0.0) - b_s)
        if idle > 0:
            events.append(pool_event("pool-idle", pool, t, a, b, idle, spot.get(t)))
    return events


def pool_summaries(store: RunStore) -> list[Summary]:
    """Every Summary of every run of the pool's store."""
    keys = store.keys(f"s3://{store.bucket}/{store.base}/runs/")
    runs = sorted({k.split("/runs/", 1)[1].split("/", 1)[0] for k in keys if "/summaries/" in k})
    out: list[Summary] = []
    for run in runs:
        out += store.summaries(store.run_prefix(run)).values()
    return out


@dataclass(frozen=True)
class PoolLedger:
    """A pool's usage in a window and where its group's history disagrees with its records."""

    events: list[UsageEvent]
    disagreements: list[str] = field(default_factory=list)


def pool_store(spec: PoolSpec) -> RunStore:
    from calque.aws.clients import client
    from calque.aws.queue import PoolQueue

    s3 = client("s3", region=spec.region, endpoint_url=spec.endpoint_url)
    return RunStore(s3, spec.bucket, spec.prefix, PoolQueue(None, spec.model, spec.queue_name).name)


def store_usage(pool: str, store: RunStore, window: Window, now: float | None = None) -> list[UsageEvent]:
    """A pool's usage in ``window`` from its bucket alone: its Summaries and its instances' records."""
    t = now if now is not None else time.time()
    return pool_usage(pool, pool_summaries(store), instance_spans(read_records(store), t), window)


def spec_usage(spec: PoolSpec, window: Window, *, cross_check: bool = True) -> PoolLedger:
    """A named pool's usage in ``window`` from its bucket, checked against its group's activity history."""
    from calque.aws.clients import client

    if spec.pool is None:
        raise UsageError(
            f"the pool spec of model {spec.model} names no pool (pool: lab-a/embedder); its lab is unknown"
        )
    store = pool_store(spec)
    now = time.time()
    spans = instance_spans(read_records(store), now)
    events = pool_usage(spec.pool, pool_summaries(store), spans, window)
    if not cross_check:
        return PoolLedger(events)
    asg = client("autoscaling", region=spec.region, endpoint_url=spec.endpoint_url)
    return PoolLedger(events, disagreements(spec.pool, spans, scaling_activities(asg, spec.pool), window))
