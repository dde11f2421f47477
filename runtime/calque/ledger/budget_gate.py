"""``pool.yml``'s lab-budget gate (the EC2 spend gate is ``aws/acquire/spend_gate.py``): what the lab's
pools cost this month (every instance of every group tagged with one of the lab's pool names, from the
usage records its instances wrote where the group's ``calque:usage`` tag says, up to now, at its type's
rate) against the lab's budget (``calque_labs.<lab>.budget``); and the broker's decision on the whole
figure (sessions on every host plus pools, ``ledger/budgets.py``'s ``lab_month``): a lab whose pools
it holds this month is refused too. No number is typed into inventory (``calque_lab_spent_elsewhere``
is deprecated)."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from typing import Any

from calque.aws.acquire.budget_hold import HOLD_TAG
from calque.aws.acquire.group import pool_groups
from calque.errors import RefusedError
from calque.ledger.budgets import budget_state, refusal
from calque.ledger.events import lab_of_pool
from calque.ledger.lab_pools import lab_pool_events
from calque.models.institution import Lab, LabBudget
from calque.models.ledger import LabSpend
from calque.models.pool_names import POOL_TAG

log = logging.getLogger("calque.ledger")


def lab_pools_spend(asg: Any, s3: Any, lab: str, now: float | None = None) -> tuple[float, float]:
    """USD and GPU-hours of every pool of ``lab`` this month, from its instances' usage records."""
    events = lab_pool_events(asg, s3, lab, now)
    return sum(e.ec2_usd or 0.0 for e in events), sum(e.gpu_seconds for e in events) / 3600.0


def held_pools(asg: Any, lab: str, month: str) -> list[str]:
    """``lab``'s pools whose groups the broker holds this month: the lab's one figure (sessions and pools)
    is over its budget (``session/broker/pool_budgets.py``)."""
    out = []
    for g in pool_groups(asg):
        tags = {x["Key"]: x["Value"] for x in g.get("Tags", [])}
        if lab_of_pool(tags[POOL_TAG]) == lab and tags.get(HOLD_TAG, "").split(" ")[0] == month:
            out.append(tags[POOL_TAG])
    return sorted(out)


def check_lab_budget(asg: Any, s3: Any, pool: str, budget: LabBudget, now: float | None = None) -> LabSpend:
    """The lab's pools this month; RefusedError (exit 4) once they spent the budget, or while the broker
    holds any of its pools for this month (its sessions and pools together are over)."""
    t = now if now is not None else time.time()
    lab = Lab(name=lab_of_pool(pool), groups=[lab_of_pool(pool)], budget=budget)  # groups: not read here
    usd, gpu_hours = lab_pools_spend(asg, s3, lab.name, t)
    spend = budget_state(lab, gpu_hours, usd, datetime.fromtimestamp(t, tz=timezone.utc))
    if spend.state == "over":
        raise RefusedError(f"refusing to launch pool {pool}: " + refusal(spend))
    held = held_pools(asg, lab.name, spend.month)
    if held:
        raise RefusedError(
            f"refusing to launch pool {pool}: lab {lab.name} is over its {budget.limit:g} {budget.unit} budget for "
            f"{spend.month} with its sessions and pools together (the broker holds {', '.join(held)} at its running "
            f"claims); new capacity is refused until next month or until {budget.raised_by} raises it"
        )
    return spend
