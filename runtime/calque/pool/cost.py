"""The warm pool's cost model: a warm hit pays no ``@enter``; the fixed cost is what claims paid.

``fixed_usd`` is the ``@enter`` time a claim (or a run's claims) actually paid, ``variable_usd`` the
time spent serving its items, both at the instance type's on-demand rate from
``calque.aws.pricing`` (the one rates table).
"""

from __future__ import annotations

from collections.abc import Iterable

from calque.aws.pricing import hourly_usd
from calque.models import ClaimCost, Summary


def claim_cost(instance_type: str, enter_seconds_paid: float, serve_seconds: float, items: int) -> ClaimCost:
    """Cost of ``serve_seconds`` of work plus ``enter_seconds_paid`` on ``instance_type`` (UsageError if unknown)."""
    rate = hourly_usd(instance_type)
    fixed = rate * enter_seconds_paid / 3600.0
    variable = rate * serve_seconds / 3600.0
    total = fixed + variable
    return ClaimCost(
        instance_type=instance_type,
        usd_per_hour=rate,
        fixed_usd=round(fixed, 9),
        variable_usd=round(variable, 9),
        total_usd=round(total, 9),
        per_item_usd=round(total / items, 9) if items else None,
    )


def run_cost(summaries: Iterable[Summary]) -> ClaimCost | None:
    """The run's cost: its claims' costs summed (None when no claim knew its instance type)."""
    costs = [s.cost for s in summaries if s.cost is not None]
    items = sum(s.items for s in summaries if s.cost is not None)
    if not costs:
        return None
    types = sorted({c.instance_type for c in costs})
    fixed = sum(c.fixed_usd for c in costs)
    variable = sum(c.variable_usd for c in costs)
    total = fixed + variable
    return ClaimCost(
        instance_type=",".join(types),
        usd_per_hour=max(c.usd_per_hour for c in costs),
        fixed_usd=round(fixed, 9),
        variable_usd=round(variable, 9),
        total_usd=round(total, 9),
        per_item_usd=round(total / items, 9) if items else None,
    )


def cost_line(cost: ClaimCost | None, enter_seconds_paid: float) -> str:
    """One human line: '$ fixed (enter 2.0 s paid) + $ variable = $ total, $ per item @ type $/h'."""
    if cost is None:
        return f"cost: unknown (no instance type on the workers); enter paid {enter_seconds_paid:.2f}s"
    per = "-" if cost.per_item_usd is None else f"${cost.per_item_usd:.8f}"
    return (
        f"cost: fixed ${cost.fixed_usd:.6f} (enter {enter_seconds_paid:.2f}s paid) + variable "
        f"${cost.variable_usd:.6f} = ${cost.total_usd:.6f}; {per} per item at {cost.instance_type} "
        f"${cost.usd_per_hour:.3f}/h"
    )
