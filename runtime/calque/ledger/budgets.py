"""A lab's month-to-date use against its budget: the checkout gate, the 80 % notice and ``pool.yml``'s
lab-budget gate all read it here, so the rule (which events count, what the limit is) exists once.

A month is the calendar month in UTC. GPU-hours budgets count every event's GPU-seconds; dollar
budgets count the events' EC2 prices (what the institution pays; Modal's price is for comparison).
An admin's override adds to the month's limit, in the budget's unit.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone

from calque.models.institution import Lab
from calque.models.ledger import LabSpend, UsageEvent


def month_of(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m")


def month_start(t: datetime) -> datetime:
    u = t.astimezone(timezone.utc)
    return datetime(u.year, u.month, 1, tzinfo=timezone.utc)


def lab_spend(lab: Lab, events: Iterable[UsageEvent], now: datetime, extra: float = 0.0) -> LabSpend:
    """``lab``'s use this month from ``events`` (already windowed to the month); its budget's state."""
    mine = [e for e in events if e.lab == lab.name]
    return budget_state(lab, sum(e.gpu_seconds for e in mine) / 3600.0, sum(e.ec2_usd or 0.0 for e in mine), now, extra)


def lab_month(
    lab: Lab, sessions: Iterable[UsageEvent], pools: Iterable[UsageEvent], now: datetime, extra: float = 0.0
) -> LabSpend:
    """The one figure of ``lab``'s month: its sessions on every host plus its pools (both already this
    month's events), against its budget. The broker computes it; each host's checkout and extend gates
    hold their own sessions plus the rest as the broker last said it (``budget_elsewhere``), and the
    pools are held on it (``session/broker/pool_budgets.py``)."""
    return lab_spend(lab, [*sessions, *pools], now, extra)


def budget_state(lab: Lab, gpu_hours: float, usd: float, now: datetime, extra: float = 0.0) -> LabSpend:
    """``lab``'s month given what it used (GPU-hours and EC2 dollars), against its budget plus ``extra``."""
    spend = LabSpend(lab=lab.name, month=month_of(now), gpu_hours=round(gpu_hours, 6), ec2_usd=round(usd, 6))
    b = lab.budget
    if b is None:
        return spend
    limit = b.limit + extra
    used = (gpu_hours if b.gpu_hours is not None else usd) / limit
    state = "over" if used >= 1.0 else "notice" if used >= b.notify_at else "ok"
    return spend.model_copy(
        update={
            "unit": b.unit,
            "limit": b.limit,
            "extra": extra,
            "used": round(used, 6),
            "state": state,
            "raised_by": b.raised_by,
        }
    )


def spent(spend: LabSpend) -> float:
    """What ``spend``'s lab used this month in its budget's unit (GPU-hours, or EC2 dollars)."""
    return spend.gpu_hours if spend.unit == "GPU-hours" else spend.ec2_usd


def budget_left(spend: LabSpend) -> float | None:
    """What is left of the month's budget (overrides included) in its unit, never below 0; None: no budget."""
    if spend.limit is None:
        return None
    return max(0.0, round(spend.limit + spend.extra - spent(spend), 6))


def when_spent(spend: LabSpend) -> str:
    """What happens to a lab's members once its budget is spent: the words of their refusal."""
    return (
        f"new checkouts by its members are refused until next month or until {spend.raised_by} raises it "
        f"(calque_labs.{spend.lab}.budget in inventory, or an admin's `calque budget override {spend.lab}`)"
    )


def refusal(spend: LabSpend) -> str:
    """The sentence a member of a lab over its budget is refused with."""
    extra = f" (+{spend.extra:g} granted by override)" if spend.extra else ""
    return (
        f"lab {spend.lab} has used {spent(spend):.2f} of its {spend.limit:g}{extra} {spend.unit} budget for "
        f"{spend.month}; {when_spent(spend)}"
    )
