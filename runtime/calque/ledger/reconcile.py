"""``calque report --reconcile``: a pool's whole days in the ledger beside what AWS billed for them.

Cost Explorer's ``GetCostAndUsage`` by the ``calque:pool`` cost allocation tag (every resource of a
pool carries it: ``models/pool_names.py``), ``UnblendedCost``, daily, over whole UTC days. It answers
only where the institution activated the tag in its billing console (from then on, not before), a day
or so late, and it counts what the ledger does not price (the disks, data transfer, the queue and
bucket): the two figures are printed side by side, never merged.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from calque.aws.aws_errors import aws_errors
from calque.ledger.events import Window
from calque.ledger.pool_usage import spec_usage
from calque.models import PoolSpec
from calque.models.ledger import Reconciliation, UsageEvent
from calque.models.pool_names import POOL_TAG

METRIC = "UnblendedCost"


def whole_days(since: float, until: float) -> tuple[datetime, datetime]:
    """The UTC days that ``[since, until]`` touches: the first's midnight and the midnight after the last."""
    a = datetime.fromtimestamp(since, tz=timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    b = datetime.fromtimestamp(until, tz=timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return a, b + timedelta(days=1)


def billed(ce: Any, pool: str, start: datetime, end: datetime) -> tuple[float | None, bool]:
    """Cost Explorer's cost of ``pool``'s tag over the days; None when it returns no figure at all."""
    total: float | None = None
    estimated = False
    token: str | None = None
    with aws_errors(f"read Cost Explorer's cost of tag {POOL_TAG}={pool}"):
        while True:
            kw: dict[str, Any] = {
                "TimePeriod": {"Start": f"{start:%Y-%m-%d}", "End": f"{end:%Y-%m-%d}"},
                "Granularity": "DAILY",
                "Metrics": [METRIC],
                "Filter": {"Tags": {"Key": POOL_TAG, "Values": [pool], "MatchOptions": ["EQUALS"]}},
            }
            if token:
                kw["NextPageToken"] = token
            page = ce.get_cost_and_usage(**kw)
            for day in page.get("ResultsByTime", []):
                amount = (day.get("Total") or {}).get(METRIC, {}).get("Amount")
                if amount is not None:
                    total = (total or 0.0) + float(amount)
                estimated = estimated or bool(day.get("Estimated"))
            token = page.get("NextPageToken")
            if not token:
                return total, estimated


def reconcile(ce: Any, pool: str, window: Window, events_for: Callable[[Window], list[UsageEvent]]) -> Reconciliation:
    """``pool``'s days touching ``window``: the ledger's EC2 dollars (``events_for(Window)``) and the bill."""
    start, end = whole_days(window.since, window.until)
    days = Window(start.timestamp(), min(end.timestamp(), window.until))
    events: list[UsageEvent] = events_for(days)
    amount, estimated = billed(ce, pool, start, end)
    return Reconciliation(
        pool=pool,
        start=f"{start:%Y-%m-%d}",
        end=f"{end:%Y-%m-%d}",
        ledger_usd=round(sum(e.ec2_usd or 0.0 for e in events), 6),
        billed_usd=None if amount is None else round(amount, 6),
        estimated=estimated,
    )


def reconcile_spec(spec: PoolSpec, window: Window) -> Reconciliation:
    """A named pool's days touching ``window``, from its bucket and from Cost Explorer (in us-east-1)."""
    from calque.aws.clients import client

    pool = spec.pool or spec.model
    ce = client("ce", region="us-east-1", endpoint_url=spec.endpoint_url)
    return reconcile(ce, pool, window, lambda w: spec_usage(spec, w, cross_check=False).events)
