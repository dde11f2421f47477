"""The labs' pools at the broker: their month to date, read from their instances' usage records (so a
lab's one figure is its sessions on every host plus its pools), and the hold on an over-budget lab's
groups, applied at every budget round between playbook runs (``aws/acquire/budget_hold.py``).

The broker runs this because it is the one component that already runs a round of every lab's month
(``ledger_every``) and already holds the institution-wide figure; a submitter or ``calque ramp`` runs
only when someone submits, and ``pool.yml`` only when someone runs it. A read that fails keeps the
last figure read (never zero, which would open every gate) and is logged.
"""

from __future__ import annotations

import logging
from typing import Any

from calque.aws.acquire.budget_hold import HoldStep, hold_pool, release_pool
from calque.errors import CalqueError
from calque.ledger.events import lab_of_pool
from calque.ledger.lab_pools import lab_pool_events, lab_pool_places
from calque.models.ledger import LabSpend, UsageEvent
from calque.session.broker.broker_config import PoolLedgerSettings

log = logging.getLogger("calque.broker")


class PoolBudgets:
    def __init__(self, settings: PoolLedgerSettings, asg: Any = None, s3: Any = None) -> None:
        from calque.aws.clients import client

        self.asg = asg or client("autoscaling", region=settings.region, endpoint_url=settings.endpoint_url)
        self.s3 = s3 or client("s3", region=settings.region, endpoint_url=settings.endpoint_url)
        self._last: list[UsageEvent] = []

    def events(self, now: float) -> list[UsageEvent]:
        """Every lab's pools this month (the last figure read, when AWS does not answer now)."""
        try:
            self._last = lab_pool_events(self.asg, self.s3, None, now)
        except CalqueError as exc:
            log.warning("cannot read the pools' usage records (%s); using the last figure read", exc)
        return self._last

    def enforce(self, spends: list[LabSpend]) -> list[HoldStep]:
        """Hold each over-budget lab's groups at their running claims; release the others' holds."""
        try:
            pools = sorted(lab_pool_places(self.asg))
        except CalqueError as exc:
            log.warning("cannot list the pools' groups (%s); their holds wait for the next round", exc)
            return []
        steps: list[HoldStep] = []
        for s in spends:
            for pool in (p for p in pools if lab_of_pool(p) == s.lab):
                try:
                    step = hold_pool(self.asg, pool, s.month) if s.state == "over" else release_pool(self.asg, pool)
                except CalqueError as exc:
                    log.warning("budget hold of pool %s: %s", pool, exc)
                    continue
                if step.action:
                    log.info(
                        "pool %s %s (lab %s %s for %s): max size %d, %d running claims",
                        pool, step.action, s.lab, s.state, s.month, step.max_size, step.running_claims,
                    )  # fmt: skip
                steps.append(step)
        return steps
