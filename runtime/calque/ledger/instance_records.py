"""A pool's instance time from its own usage records (``models/instance_usage.py``), never from what
EC2 still lists, and the cross-check of those records against the group's activity history.

An instance's time up is the union of its records' stretches (the warm-up's from the boot, each
worker's from its start): a stretch ends where its writer knew the end (``ended_at``), else at its
last heartbeat once that is older than ``RECORD_LIVE_S`` (the instance stopped or died without a
word), else it is live and runs to the window's end. Overlaps count once.

Auto Scaling keeps six weeks of activities (``DescribeScalingActivities``): each launch and
termination of an instance with its times. An instance the group launched or ended inside the window
that has no record, or whose records end far from the termination the group reports, is a
disagreement, printed beside the report, never silently corrected: the records are what was seen,
the activity what AWS did.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from calque.aws.aws_errors import aws_errors
from calque.aws.object_reads import get_many
from calque.aws.store import RunStore, parse_s3_uri
from calque.ledger.events import Window
from calque.models.instance_usage import RECORD_LIVE_S, InstanceRecord, usage_prefix
from calque.models.pool_names import pool_names

log = logging.getLogger("calque.ledger")
# A record's end and the group's termination of the same instance may differ by the drain (the hook's
# wait), a missed heartbeat or two and the activity's own lag: more than this is a disagreement.
AGREE_S = RECORD_LIVE_S + 300.0
_ACTIVITY_INSTANCE = re.compile(r"(Launching a new|Terminating) EC2 instance: (i-[0-9a-f]+)")


@dataclass(frozen=True)
class InstanceSpan:
    instance_id: str
    instance_type: str
    started: float
    ended: float | None  # None: still running
    spot_usd_per_hour: float | None = None


def read_records(store: RunStore) -> list[InstanceRecord]:
    """Every usage record in the pool's bucket."""
    return read_records_at(store.s3, usage_prefix(store))


def read_records_at(s3: Any, uri_prefix: str) -> list[InstanceRecord]:
    """Every usage record under ``uri_prefix``; one that does not parse is skipped, with its key logged."""
    bucket, key_prefix = parse_s3_uri(uri_prefix)
    keys: list[str] = []
    with aws_errors(f"list the usage records under {uri_prefix}"):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key_prefix):
            keys += [o["Key"] for o in page.get("Contents", [])]
    out: list[InstanceRecord] = []
    for key, body in zip(keys, get_many(s3, bucket, keys), strict=True):
        if body is None:
            continue
        try:
            out.append(InstanceRecord.model_validate_json(body))
        except ValidationError as exc:  # another writer's garbage: the group's history flags the instance
            log.warning("skipping usage record s3://%s/%s: %s", bucket, key, exc)
    return out


def _stretch_end(r: InstanceRecord, now: float) -> float | None:
    """Where a record's stretch ends; None: live now."""
    if r.ended_at is not None:
        return r.ended_at.timestamp()
    seen = r.seen_at.timestamp()
    return seen if now - seen > RECORD_LIVE_S else None


def instance_spans(records: Iterable[InstanceRecord], now: float) -> list[InstanceSpan]:
    """Each instance's time up as disjoint spans: the union of its records' stretches."""
    live = float("inf")
    by_instance: dict[str, list[InstanceRecord]] = {}
    for r in records:
        by_instance.setdefault(r.instance_id, []).append(r)
    out: list[InstanceSpan] = []
    for iid in sorted(by_instance):
        rs = by_instance[iid]
        itype = rs[0].instance_type
        stretches = []
        for r in rs:
            end = _stretch_end(r, now)
            stretches.append((r.started_at.timestamp(), live if end is None else end))
        gone = [r.ended_at.timestamp() for r in rs if r.end == "terminated" and r.ended_at is not None]
        if gone:  # terminated: no stretch outlives it, whatever another writer last said
            stretches = [(min(a, max(gone)), min(b, max(gone))) for a, b in stretches]
        stretches.sort()
        cur_a, cur_b = stretches[0]
        for a, b in stretches[1:]:
            if a <= cur_b:  # overlapping or touching: one span
                cur_b = max(cur_b, b)
                continue
            out.append(InstanceSpan(iid, itype, cur_a, None if cur_b == live else cur_b))
            cur_a, cur_b = a, b
        out.append(InstanceSpan(iid, itype, cur_a, None if cur_b == live else cur_b))
    return out


def scaling_activities(asg: Any, pool: str) -> dict[str, dict[str, float]]:
    """The group's launches and terminations per instance (``launched``, ``terminated``: epoch seconds)."""
    group = pool_names(pool).group
    out: dict[str, dict[str, float]] = {}
    with aws_errors(f"read the scaling activities of group {group}"):
        for page in asg.get_paginator("describe_scaling_activities").paginate(AutoScalingGroupName=group):
            for act in page.get("Activities", []):
                m = _ACTIVITY_INSTANCE.search(act.get("Description") or "")
                if m is None or act.get("StatusCode") not in (None, "Successful", "InProgress"):
                    continue
                kind = "launched" if m.group(1).startswith("Launching") else "terminated"
                at = act.get("EndTime") or act.get("StartTime")
                if at is not None:
                    out.setdefault(m.group(2), {})[kind] = float(at.timestamp())
    return out


def disagreements(
    pool: str, spans: list[InstanceSpan], activities: dict[str, dict[str, float]], window: Window
) -> list[str]:
    """Where the group's history and the records differ inside ``window``, one sentence each."""
    by_id: dict[str, list[InstanceSpan]] = {}
    for s in spans:
        by_id.setdefault(s.instance_id, []).append(s)
    out: list[str] = []
    for iid in sorted(activities):
        act = activities[iid]
        launched, terminated = act.get("launched"), act.get("terminated")
        inside = any(t is not None and window.since <= t <= window.until for t in (launched, terminated))
        if not inside:
            continue
        mine = by_id.get(iid)
        if not mine:
            out.append(f"pool {pool}: the group launched or ended {iid} in the window but it wrote no usage record")
            continue
        if terminated is not None:
            last = max((s.ended if s.ended is not None else window.until) for s in mine)
            if abs(last - terminated) > AGREE_S:
                out.append(
                    f"pool {pool}: {iid}'s records end {last - terminated:+.0f} s from its termination "
                    "in the group's activity history"
                )
    return out
