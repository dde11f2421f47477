"""A pool's usage: its instances' seconds, split into busy (claims) and warm-idle.

Busy seconds are the claims' own (``Summary.claim_seconds``, written by the workers, inside the
window by the claim's start and end); instance-seconds come from the group's instance lifecycle as
EC2 reports it (launch time; for a terminated instance, the time in its state-transition reason).
Per instance type, warm-idle = instance-seconds - busy seconds (never below 0): an instance up and
serving nothing is paid on EC2 and would cost nothing on Modal. One worker per instance is assumed
(a cloud pool's shape): claims of several workers on one instance would count its seconds twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from calque.aws.errors import aws_errors
from calque.aws.store import RunStore
from calque.errors import UsageError
from calque.ledger.events import Window, pool_event
from calque.models import PoolSpec, Summary
from calque.models.ledger import UsageEvent
from calque.models.pool_names import pool_names

_REASON_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})")


@dataclass(frozen=True)
class InstanceSpan:
    instance_id: str
    instance_type: str
    started: float
    ended: float | None  # None: still running
    spot_usd_per_hour: float | None = None


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


def _ended(inst: dict[str, Any]) -> float | None:
    if inst.get("State", {}).get("Name") not in ("terminated", "shutting-down", "stopped"):
        return None
    m = _REASON_TIME.search(inst.get("StateTransitionReason") or "")
    if m is None:
        return float(inst["LaunchTime"].timestamp())  # no end time to read: counted as nothing, never as all
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()


def group_instances(ec2: Any, pool: str) -> list[InstanceSpan]:
    """Every instance EC2 still lists for the pool's Auto Scaling group, running or ended."""
    group = pool_names(pool).group
    out: list[InstanceSpan] = []
    with aws_errors(f"list the instances of group {group}"):
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "tag:aws:autoscaling:groupName", "Values": [group]}]
        )
        for page in pages:
            for res in page.get("Reservations", []):
                for inst in res.get("Instances", []):
                    out.append(
                        InstanceSpan(
                            instance_id=inst["InstanceId"],
                            instance_type=inst["InstanceType"],
                            started=float(inst["LaunchTime"].timestamp()),
                            ended=_ended(inst),
                        )
                    )
    return out


def pool_summaries(store: RunStore) -> list[Summary]:
    """Every Summary of every run of the pool's store."""
    keys = store.keys(f"s3://{store.bucket}/{store.base}/runs/")
    runs = sorted({k.split("/runs/", 1)[1].split("/", 1)[0] for k in keys if "/summaries/" in k})
    out: list[Summary] = []
    for run in runs:
        out += store.summaries(store.run_prefix(run)).values()
    return out


def spec_usage(spec: PoolSpec, window: Window) -> list[UsageEvent]:
    """A named pool's usage in ``window``, read from AWS: its Summaries (S3) and its group's instances (EC2)."""
    from calque.aws.clients import client
    from calque.aws.queue import PoolQueue

    if spec.pool is None:
        raise UsageError(
            f"the pool spec of model {spec.model} names no pool (pool: lab-a/embedder); its lab is unknown"
        )
    s3 = client("s3", region=spec.region, endpoint_url=spec.endpoint_url)
    ec2 = client("ec2", region=spec.region, endpoint_url=spec.endpoint_url)
    store = RunStore(s3, spec.bucket, spec.prefix, PoolQueue(None, spec.model, spec.queue_name).name)
    return pool_usage(spec.pool, pool_summaries(store), group_instances(ec2, spec.pool), window)
