"""The session daemon's Prometheus metrics (``prometheus_client``), computed when scraped.

Slices free/busy per profile, live sessions, lifecycle events, and the trip time of ended sessions
(checkout to end) as a histogram. Events and trips come from the audit trail, so they are exact
across every process of the daemon. Off unless the config names a port or a textfile.

Who holds what is not public: ``list`` hides holders from non-admins, and so do the metrics. The
port and the textfile (which node_exporter serves to anyone who can reach it) carry the number of
live sessions only; live sessions per user are in the ``metrics`` op's answer to an admin alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from calque.models.session import Slice
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
    ) -> None:
        self._slices = slices
        self._live = live
        self._tally = tally
        self._holders = holders  # sessions per user (admins only), else their number

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


def _le(bound: float) -> str:
    return f"{bound:g}" if bound < 1e6 else repr(bound)


def collector_registry(
    inventory: SliceInventory, live: Callable[[], list[Held]], tally: EventTally | None, holders: bool = False
) -> CollectorRegistry:
    """A registry over the daemon's state: slices as the inventory knows them (none while it cannot
    tell), live sessions (per user only with ``holders``: for admins), events and trips."""

    def slices() -> list[Slice]:
        try:
            return inventory.slices()
        except RequestError:
            return []

    made = CollectorRegistry(auto_describe=False)
    made.register(SessionCollector(slices, live, tally, holders))
    return made


def render(registry: CollectorRegistry) -> str:
    """The Prometheus text exposition of ``registry`` (what the endpoint and ``calque session metrics`` show)."""
    return generate_latest(registry).decode()
