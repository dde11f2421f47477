"""``pool.yml``'s spend gate against the lab's month: what the lab's pools cost this month (every
instance of every group tagged with one of the lab's pool names, from the usage records its instances
wrote where the group's ``calque:usage`` tag says, up to now, at its type's rate) plus
what its sessions cost (``spent_elsewhere``: ``calque report --institution --by lab``'s figure, as
the inventory passes it), against the lab's budget (``calque_labs.<lab>.budget``)."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from typing import Any

from calque.aws.acquire.group import pool_groups
from calque.errors import RefusedError
from calque.ledger.budgets import budget_state, month_start, refusal
from calque.ledger.events import Window, lab_of_pool
from calque.ledger.instance_records import instance_spans, read_records_at
from calque.ledger.pools import pool_usage
from calque.models.institution import Lab, LabBudget
from calque.models.ledger import LabSpend
from calque.models.pool_names import POOL_TAG, USAGE_TAG

log = logging.getLogger("calque.ledger")


def lab_pool_places(asg: Any, lab: str) -> dict[str, str | None]:
    """Each pool of ``lab`` with a group, and where its usage records are (None: a group made before
    calque tagged it, which counts nothing until ``pool.yml`` runs on it again)."""
    out: dict[str, str | None] = {}
    for g in pool_groups(asg):
        tags = {x["Key"]: x["Value"] for x in g.get("Tags", [])}
        if lab_of_pool(tags[POOL_TAG]) == lab:
            out[tags[POOL_TAG]] = tags.get(USAGE_TAG) or out.get(tags[POOL_TAG])
    return out


def lab_pools_spend(asg: Any, s3: Any, lab: str, now: float | None = None) -> tuple[float, float]:
    """USD and GPU-hours of every pool of ``lab`` this month, from its instances' usage records."""
    t = now if now is not None else time.time()
    start = month_start(datetime.fromtimestamp(t, tz=timezone.utc)).timestamp()
    usd = gpu_s = 0.0
    for pool, place in sorted(lab_pool_places(asg, lab).items()):
        if place is None:
            log.warning("pool %s's group has no %s tag: its instances' usage is not counted", pool, USAGE_TAG)
            continue
        spans = instance_spans(read_records_at(s3, place), t)
        for e in pool_usage(pool, [], spans, Window(start, t)):
            usd += e.ec2_usd or 0.0
            gpu_s += e.gpu_seconds
    return usd, gpu_s / 3600.0


def check_lab_budget(
    asg: Any, s3: Any, pool: str, budget: LabBudget, spent_elsewhere: float = 0.0, now: float | None = None
) -> LabSpend:
    """The lab's month to date with ``pool``'s siblings counted; RefusedError (exit 4) once it is spent.

    ``spent_elsewhere`` is in the budget's unit (GPU-hours or USD): the lab's sessions, from the report."""
    t = now if now is not None else time.time()
    lab = Lab(name=lab_of_pool(pool), groups=[lab_of_pool(pool)], budget=budget)  # groups: not read here
    usd, gpu_hours = lab_pools_spend(asg, s3, lab.name, t)
    if budget.gpu_hours is not None:
        gpu_hours += spent_elsewhere
    else:
        usd += spent_elsewhere
    spend = budget_state(lab, gpu_hours, usd, datetime.fromtimestamp(t, tz=timezone.utc))
    if spend.state == "over":
        raise RefusedError(f"refusing to launch pool {pool}: " + refusal(spend))
    return spend
