"""A lab's pools this month, from their instances' usage records (``ledger/instance_records.py``),
found through their groups' ``calque:usage`` tags: what the broker adds to each lab's month (the one
figure every gate reads) and what ``pool.yml``'s gate counts.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from typing import Any

from calque.aws.acquire.group import pool_groups
from calque.ledger.budgets import month_start
from calque.ledger.events import Window, lab_of_pool
from calque.ledger.instance_records import instance_spans, read_records_at
from calque.ledger.pool_usage import pool_usage
from calque.models.ledger import UsageEvent
from calque.models.pool_names import POOL_TAG, USAGE_TAG

log = logging.getLogger("calque.ledger")


def lab_pool_places(asg: Any, lab: str | None = None) -> dict[str, str | None]:
    """Each pool (of ``lab``, or every lab) with a group, and where its usage records are (None: a group
    made before calque tagged it, which counts nothing until ``pool.yml`` runs on it again)."""
    out: dict[str, str | None] = {}
    for g in pool_groups(asg):
        tags = {x["Key"]: x["Value"] for x in g.get("Tags", [])}
        if lab is None or lab_of_pool(tags[POOL_TAG]) == lab:
            out[tags[POOL_TAG]] = tags.get(USAGE_TAG) or out.get(tags[POOL_TAG])
    return out


def lab_pool_events(asg: Any, s3: Any, lab: str | None = None, now: float | None = None) -> list[UsageEvent]:
    """Every pool instance's time this month (of ``lab``'s pools, or every lab's), from the records."""
    t = now if now is not None else time.time()
    window = Window(month_start(datetime.fromtimestamp(t, tz=timezone.utc)).timestamp(), t)
    events: list[UsageEvent] = []
    for pool, place in sorted(lab_pool_places(asg, lab).items()):
        if place is None:
            log.warning("pool %s's group has no %s tag: its instances' usage is not counted", pool, USAGE_TAG)
            continue
        events += pool_usage(pool, [], instance_spans(read_records_at(s3, place), t), window)
    return events
