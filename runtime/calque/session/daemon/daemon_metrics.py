"""The session daemon's Prometheus metrics (``prometheus_client``), computed when scraped.

Slices free/busy per profile, live sessions, lifecycle events, the trip time of ended sessions
(checkout to end) as a histogram, and, where idle reclaim is on, how long each held slice has been
idle by its idle clock (``calque_session_idle_seconds``, beside the policy's ``for``), and drains
(``calque_session_drained``, by GPU; ``gpu="all"`` for the host). Events and
trips come from the audit trail, so they are exact across every process of the daemon. Off unless
the config names a port or a textfile.

Who holds what is not public: ``list`` hides holders from non-admins, and so do the metrics. The
port and the textfile (which node_exporter serves to anyone who can reach it) carry the number of
live sessions only; live sessions per user are in the ``metrics`` op's answer to an admin alone.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from calque.models.session import Drain, Slice
from calque.session.daemon.audit import EventTally
from calque.session.daemon.inventory import SliceInventory
from calque.session.daemon.rows import Held
from calque.session.daemon.wire import RequestError


class SessionCollector(Collector):
    """Reads the daemon's state at each scrape (``slices`` may raise nothing: an empty list when unknown)."""

    def __init__(
        self,
        slices: Callable[[], list[Slice]],
        live: Callable[[], list[Held]],
        tally: EventTally | None,
        holders: bool = False,
        idle_for: float | None = None,
        drains: Callable[[], list[Drain]] | None = None,
    ) -> None:
        self._slices = slices
        self._drains = drains
        self._live = live
        self._tally = tally
        self._holders = holders  # sessions per user (admins only), else their number
        self._idle_for = idle_for  # the idle policy's ``for``; None: idle reclaim is off

    def collect(self) -> Iterator[Metric]:
        live = self._live()
        busy_ids = {h.session.slice_id for h in live}
        slices = GaugeMetricFamily(
            "calque_session_slices",
            "Slices on this host by kind, profile and state.",
            labels=["kind", "profile", "state"],
        )
        per: dict[tuple[str, str, str], int] = {}
        for sl in self._slices():
            for state in ("free", "busy"):
                per.setdefault((sl.kind, sl.profile, state), 0)
            per[(sl.kind, sl.profile, "busy" if sl.id in busy_ids else "free")] += 1
        for labels, n in sorted(per.items()):
            slices.add_metric(list(labels), n)
        yield slices
        if self._holders:
            sessions = GaugeMetricFamily("calque_session_sessions", "Live sessions per user.", labels=["user"])
            for user, n in sorted(Counter(h.session.user for h in live).items()):
                sessions.add_metric([user], n)
        else:
            sessions = GaugeMetricFamily("calque_session_sessions", "Live sessions.", value=len(live))
        yield sessions
        events = CounterMetricFamily(
            "calque_session_events", "Session lifecycle events since the daemon started.", labels=["event"]
        )
        trips = HistogramMetricFamily(
            "calque_session_trip_seconds", "Seconds from a session's checkout to its end, for sessions that ended."
        )
        if self._tally is not None:
            for event, n in sorted(self._tally.counts().items()):
                events.add_metric([event], n)
            buckets, count, total = self._tally.trips()
            trips.add_metric([], [(_le(b), n) for b, n in buckets] + [("+Inf", count)], total)
        yield events
        yield trips
        if self._idle_for is not None:
            yield from self._idle(live)
        if self._drains is not None:
            yield from self._drained(self._drains())

    @staticmethod
    def _drained(drains: list[Drain]) -> Iterator[Metric]:
        # One series per drain (gpu "all": the whole host); no drain, no series. Reasons stay in
        # `calque session list`: free text makes a poor label.
        drained = GaugeMetricFamily(
            "calque_session_drained", "Drains of this host (gpu=all) or of its GPUs: 1 while drained.", labels=["gpu"]
        )
        deadline = GaugeMetricFamily(
            "calque_session_drain_deadline_seconds",
            "Unix time by which a drain ends the sessions it covers (drains with --by only).",
            labels=["gpu"],
        )
        for d in drains:
            gpu = "all" if d.gpu is None else str(d.gpu)
            drained.add_metric([gpu], 1)
            if d.deadline is not None:
                deadline.add_metric([gpu], d.deadline.timestamp())
        yield drained
        yield deadline

    def _idle(self, live: list[Held]) -> Iterator[Metric]:
        # Per held slice, never per holder: a slice id says nothing of who holds it.
        idle = GaugeMetricFamily(
            "calque_session_idle_seconds",
            "Seconds each held slice has been idle by its idle clock (0 while it is active).",
            labels=["kind", "profile", "slice"],
        )
        now = time.time()
        for h in sorted(live, key=lambda x: x.slice.id):
            idle.add_metric([h.slice.kind, h.slice.profile, h.slice.id], max(0.0, now - h.last_active))
        yield idle
        reclaim = "Idle seconds after which a session is reclaimed."
        yield GaugeMetricFamily("calque_session_idle_reclaim_seconds", reclaim, value=self._idle_for)


def _le(bound: float) -> str:
    return f"{bound:g}" if bound < 1e6 else repr(bound)


def collector_registry(
    inventory: SliceInventory,
    live: Callable[[], list[Held]],
    tally: EventTally | None,
    holders: bool = False,
    idle_for: float | None = None,
    drains: Callable[[], list[Drain]] | None = None,
) -> CollectorRegistry:
    """A registry over the daemon's state: slices as the inventory knows them (none while it cannot
    tell), live sessions (per user only with ``holders``: for admins), events, trips, and (with
    ``idle_for``, the idle policy's ``for``) each held slice's idle seconds."""

    def slices() -> list[Slice]:
        try:
            return inventory.slices()
        except RequestError:
            return []

    made = CollectorRegistry(auto_describe=False)
    made.register(SessionCollector(slices, live, tally, holders, idle_for, drains))
    return made


def render(registry: CollectorRegistry) -> str:
    """The Prometheus text exposition of ``registry`` (what the endpoint and ``calque session metrics`` show)."""
    return generate_latest(registry).decode()
