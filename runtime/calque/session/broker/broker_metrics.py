"""The broker's Prometheus metrics (``prometheus_client``), read from its queue file when scraped.

Live requests by lab, kind, profile and state (``queued``, ``granting``, ``held`` for a client that
went away), how long the oldest queued request of each (lab, kind, profile) has waited, and the
queue's aging bound beside it (``calque_broker_queue_aging_seconds``), so that an alert on waits
past the bound follows the config instead of a number copied into a rule; and each budgeted lab's
month to date over its budget (``calque_lab_budget_used_ratio``, 1.0 = all of it) as the ledger's
last round found it (a scrape never asks the hosts). Counts per lab, never
who waits: a request's user is in ``calque session queue`` for admins alone. Off unless the config
names ``metrics_port``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from calque.models.ledger import LabSpend
from calque.session.broker.store import Row

ANY_PROFILE = "any"  # the profile label of a request that names none (any slice of its kind)
STATES = ("queued", "granting", "held")


class BrokerCollector(Collector):
    """Reads ``live()`` (the store's queued, granting and held rows) at each scrape."""

    def __init__(
        self,
        live: Callable[[], list[Row]],
        aging: float,
        now: Callable[[], float] = time.time,
        budgets: Callable[[], list[LabSpend]] = list,
    ) -> None:
        self._live = live
        self._aging = aging
        self._now = now
        self._budgets = budgets

    def collect(self) -> Iterator[Metric]:
        rows, now = self._live(), self._now()
        labels = ["lab", "kind", "profile"]
        requests = GaugeMetricFamily(
            "calque_broker_requests", "Live requests by lab, kind, profile and state.", labels=[*labels, "state"]
        )
        counts: dict[tuple[str, str, str, str], int] = {}
        oldest: dict[tuple[str, str, str], float] = {}
        for r in rows:
            key = (r.lab, r.kind, r.profile or ANY_PROFILE)
            for state in STATES:  # each state of a key with live requests, 0 included
                counts.setdefault((*key, state), 0)
            this = (*key, r.state)
            counts[this] += 1
            if r.state == "queued":
                oldest[key] = max(oldest.get(key, 0.0), now - r.enqueued_at)
        for key4, n in sorted(counts.items()):
            requests.add_metric(list(key4), n)
        yield requests
        wait = GaugeMetricFamily(
            "calque_broker_queue_wait_seconds",
            "Seconds the oldest queued request of each lab, kind and profile has waited.",
            labels=labels,
        )
        for key3, waited in sorted(oldest.items()):
            wait.add_metric(list(key3), max(0.0, waited))
        yield wait
        aging = "A request waiting this long goes ahead of every later one (the queue's aging bound)."
        yield GaugeMetricFamily("calque_broker_queue_aging_seconds", aging, value=self._aging)
        used = GaugeMetricFamily(
            "calque_lab_budget_used_ratio",
            "Each budgeted lab's month to date over its budget and overrides (1.0 = all of it), institution-wide.",
            labels=["lab"],
        )
        for spend in sorted(self._budgets(), key=lambda s: s.lab):
            if spend.used is not None:
                used.add_metric([spend.lab], spend.used)
        yield used


def collector_registry(
    live: Callable[[], list[Row]], aging: float, budgets: Callable[[], list[LabSpend]] = list
) -> CollectorRegistry:
    made = CollectorRegistry(auto_describe=False)
    made.register(BrokerCollector(live, aging, budgets=budgets))
    return made
