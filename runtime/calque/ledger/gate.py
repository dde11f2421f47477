"""``pool.yml``'s spend gate against the lab's month: what the lab's pools cost this month (every
instance of every group tagged with one of the lab's pool names, up to now, at its type's rate) plus
what its sessions cost (``spent_elsewhere``: ``calque report --institution --by lab``'s figure, as
the inventory passes it), against the lab's budget (``calque_labs.<lab>.budget``)."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from calque.aws.acquire.group import pool_groups
from calque.errors import RefusedError
from calque.ledger.budgets import budget_state, month_start, refusal
from calque.ledger.events import Window, lab_of_pool
from calque.ledger.pools import group_instances, pool_usage
from calque.models.institution import Lab, LabBudget
from calque.models.ledger import LabSpend
from calque.models.pool_names import POOL_TAG


def lab_pools_spend(asg: Any, ec2: Any, lab: str, now: float | None = None) -> tuple[float, float]:
    """USD and GPU-hours of every pool of ``lab`` this month, from its groups' instances."""
    t = now if now is not None else time.time()
    start = month_start(datetime.fromtimestamp(t, tz=timezone.utc)).timestamp()
    pools = {next(x["Value"] for x in g.get("Tags", []) if x["Key"] == POOL_TAG) for g in pool_groups(asg)}
    usd = gpu_s = 0.0
    for pool in sorted(p for p in pools if lab_of_pool(p) == lab):
        for e in pool_usage(pool, [], group_instances(ec2, pool), Window(start, t)):
            usd += e.ec2_usd or 0.0
            gpu_s += e.gpu_seconds
    return usd, gpu_s / 3600.0


def check_lab_budget(
    asg: Any, ec2: Any, pool: str, budget: LabBudget, spent_elsewhere: float = 0.0, now: float | None = None
) -> LabSpend:
    """The lab's month to date with ``pool``'s siblings counted; RefusedError (exit 4) once it is spent.

    ``spent_elsewhere`` is in the budget's unit (GPU-hours or USD): the lab's sessions, from the report."""
    t = now if now is not None else time.time()
    lab = Lab(name=lab_of_pool(pool), groups=[lab_of_pool(pool)], budget=budget)  # groups: not read here
    usd, gpu_hours = lab_pools_spend(asg, ec2, lab.name, t)
    if budget.gpu_hours is not None:
        gpu_hours += spent_elsewhere
    else:
        usd += spent_elsewhere
    spend = budget_state(lab, gpu_hours, usd, datetime.fromtimestamp(t, tz=timezone.utc))
    if spend.state == "over":
        raise RefusedError(f"refusing to launch pool {pool}: " + refusal(spend))
    return spend
