"""The broker's demand for elastic session hosts, published per class (issue 25), off the grant path.

The broker never calls AWS for capacity: it says what it sees, and the class's Auto Scaling policies
act (``calque.aws.acquire.fleet_scaling``). Every ``publish_every`` seconds one thread of its own:

- counts, per class of ``broker.yaml``'s ``fleet``, the queued requests waiting longer than
  ``wait_s``, with a client waiting on them now, that the class could serve (``serves``: its hosts'
  offers), less the grantable free slices of the class's reachable hosts, per kind and profile: each
  free slice takes one waiter it matches, and the waiters left are ``UnservedRequests`` (a slice
  on a drained GPU or host, or an MPS slot whose daemon is down, as the host's list marks it, is no
  supply: nobody can check it out); and the class's reachable hosts with no live session
  (``IdleHosts``; a drained host counts too, so scale-in may take it);
- publishes them to CloudWatch (``calque/session``, dimension ``Class``) in one ``PutMetricData``:
  ``IdleHosts`` every period, ``UnservedRequests`` only while it is above zero (nothing waits that
  the class could take: nothing to say, and the scale-out alarm treats silence as "no");
- reads the hosts each class registered (``/calque/session-fleet/<class>/hosts/<instance>``, written
  by ``calque session fleet register`` on the host) and adds or drops them in the host cache.

The loop that grants reads the store and the cache as before; this thread only reads them (each under
its own lock) and a failed or slow AWS call costs this thread's period, never a grant.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from calque.models.broker import HostView
from calque.models.fleet import (
    CLASS_DIMENSION,
    DEMAND_METRIC,
    DEMAND_NAMESPACE,
    DemandSettings,
    HostRegistration,
    registration_path,
    serves,
)
from calque.models.reservation import Reservation
from calque.models.session import SliceState
from calque.session.broker.hosts import HostCache, HostLink, free_matching
from calque.session.broker.reserve_capacity import ReservedCapacity
from calque.session.broker.store import Row, Store

log = logging.getLogger("calque.broker")
IDLE_METRIC = "IdleHosts"  # the same name as calque.aws.acquire.fleet_scaling's (a test holds them equal)
LinkFactory = Callable[[HostRegistration], HostLink]


@dataclass(frozen=True)
class ClassDemand:
    fleet_class: str
    unserved: int
    idle_hosts: int
    hosts: int


def count_demand(
    settings: DemandSettings,
    queued: Iterable[Row],
    views: Iterable[HostView],
    members: dict[str, str],
    now: float,
    present: Callable[[str], bool] = lambda request_id: True,
) -> list[ClassDemand]:
    """Each class's unserved requests and idle hosts, from the queue and the host cache as they are now.

    ``members`` maps a host's name to its class (hosts of no class count for none); a request no
    client waits on now (``present``) is no demand, nor is one pinned to a host (``_less_pinned``). Supply is
    ``free_matching``: free, not drained, not unavailable; each free slice serves one waiter (those
    naming its profile first, then those taking any profile of its kind). Idle is "no busy slice",
    drained or not."""
    rows = [r for r in queued if now - r.enqueued_at >= settings.wait_s and present(r.id)]
    by_class: dict[str, list[HostView]] = {c: [] for c in settings.classes}
    for v in views:
        c = members.get(v.name)
        if c in by_class:
            by_class[c].append(v)
    out = []
    for name, cls in sorted(settings.classes.items()):
        hosts = [v for v in by_class[name] if v.reachable]
        wanting = [r for r in rows if serves(cls.offers, r.kind, r.profile)]
        free = [(v.name, s) for v in hosts for s in free_matching(v, "mig", None) + free_matching(v, "mps", None)]
        unserved = _unserved([r for r in wanting if r.only_host is None], _less_pinned(wanting, free))
        idle = sum(1 for v in hosts if not any(s.busy for s in v.slices))
        out.append(ClassDemand(name, unserved, idle, len(hosts)))
    return out


def _less_pinned(wanting: list[Row], free: list[tuple[str, SliceState]]) -> list[SliceState]:
    """The free slices left once each request pinned to one host (a plain ``checkout`` or ``--gpu N``
    on an institution's host) has taken one it matches there. A pinned request is never unserved
    demand: a host the class adds could not serve it; nor may it take a slice on another host from
    a waiter that host could serve."""
    left = list(free)
    for r in wanting:
        if r.only_host is None:
            continue
        i = next(
            (
                i
                for i, (host, s) in enumerate(left)
                if host == r.only_host
                and s.slice.kind == r.kind
                and r.profile in (None, s.slice.profile)
                and r.gpu in (None, s.slice.gpu_index)
            ),
            None,
        )
        if i is not None:
            del left[i]
    return [s for _, s in left]


def _unserved(wanting: list[Row], free: list[SliceState]) -> int:
    """Waiters left when each free slice takes one it matches: the ones naming a profile first (a
    waiter for any profile can take what they leave)."""
    supply: collections.Counter[tuple[str, str]] = collections.Counter((s.slice.kind, s.slice.profile) for s in free)
    left = 0
    for r in sorted(wanting, key=lambda r: r.profile is None):
        key = next(
            (k for k, n in supply.items() if n > 0 and k[0] == r.kind and (r.profile is None or k[1] == r.profile)),
            None,
        )
        if key is None:
            left += 1
        else:
            supply[key] -= 1
    return left


def metric_data(demand: list[ClassDemand], at: datetime) -> list[dict[str, Any]]:
    """The ``PutMetricData`` entries for ``demand``: idle hosts always, unserved requests only above zero."""
    out = []
    for d in demand:
        dims = [{"Name": CLASS_DIMENSION, "Value": d.fleet_class}]
        out.append({"MetricName": IDLE_METRIC, "Dimensions": dims, "Timestamp": at, "Value": float(d.idle_hosts)})
        if d.unserved > 0:
            out.append({"MetricName": DEMAND_METRIC, "Dimensions": dims, "Timestamp": at, "Value": float(d.unserved)})
    return out


class FleetDemand:
    """The broker's publishing thread. ``cloudwatch``/``ssm`` are made on first use (calque.aws.clients)."""

    def __init__(
        self,
        settings: DemandSettings,
        store: Store,
        cache: HostCache,
        link: LinkFactory,
        *,
        clients: Any = None,
        present: Callable[[str], bool] = lambda request_id: True,
        reservations: Callable[[], list[Reservation]] = list,
    ) -> None:
        self.settings, self.store, self.cache, self.link = settings, store, cache, link
        # Desired capacity raised ahead of reservations (reserve_capacity.py), by this thread's period.
        self.reserved = ReservedCapacity(
            settings, cache, reservations, lambda: dict(self.members), lambda: self._client("autoscaling")
        )
        self.present = present  # whether a client waits on a request now: one without is no demand
        self._clients: dict[str, Any] = dict(clients or {})
        self.members: dict[str, str] = {}  # registered host -> class
        self.last: list[ClassDemand] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-fleet-demand", daemon=True)

    def _client(self, service: str) -> Any:
        if service not in self._clients:
            from calque.aws.clients import client

            s = self.settings
            self._clients[service] = client(service, region=s.region, endpoint_url=s.endpoint_url)
        return self._clients[service]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.once()
            except Exception:  # a broker that cannot reach AWS still grants
                log.exception("publishing the fleet's demand failed; next try in %gs", self.settings.publish_every)
            self._stop.wait(self.settings.publish_every)

    def once(self, now: float | None = None) -> list[ClassDemand]:
        """One period: registrations read, demand counted and published; returns what was counted."""
        if self.settings.discover:
            try:
                self.discover()
            except Exception:  # the hosts it knows are still counted and published
                log.exception("reading the classes' registrations failed")
        t = time.time() if now is None else now
        queued = self.store.in_state("queued")
        self.last = count_demand(self.settings, queued, self.cache.views(), self.members, t, self.present)
        data = metric_data(self.last, datetime.fromtimestamp(t, timezone.utc))
        if data:
            self._client("cloudwatch").put_metric_data(Namespace=DEMAND_NAMESPACE, MetricData=data)
        try:
            self.reserved.apply(t)
        except Exception:  # the demand is published; the raise is tried again next period
            log.exception("raising the fleet's capacity for reservations failed")
        return self.last

    def discover(self) -> None:
        """The classes' registered hosts into the cache; a host whose registration is gone, out of it."""
        found: dict[str, HostRegistration] = {}
        ssm = self._client("ssm")
        for name in sorted(self.settings.classes):
            pages = ssm.get_paginator("get_parameters_by_path").paginate(Path=registration_path(name), Recursive=True)
            for page in pages:
                for p in page.get("Parameters", []):
                    try:
                        reg = HostRegistration.model_validate(json.loads(p["Value"]))
                    except (ValueError, ValidationError) as exc:
                        log.warning("ignoring registration %s: %s", p.get("Name"), exc)
                        continue
                    if reg.fleet_class == name:
                        found[reg.name] = reg
        for host, reg in found.items():
            if host not in self.members and self.cache.add(host, self.link(reg)):
                log.info("host %s of class %s registered (%s:%d)", host, reg.fleet_class, reg.address, reg.port)
            self.members[host] = reg.fleet_class
        for host in sorted(set(self.members) - set(found)):
            self.cache.remove(host)
            del self.members[host]
            log.info("host %s left its class", host)
