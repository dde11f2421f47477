"""``calque session broker``: one process holding the queue file, the host cache, the loop and the
sockets, built from the config and the institution (hosts, labs, shares) it is handed."""

from __future__ import annotations

import logging
import os
import resource
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType

from calque import exposition
from calque.errors import CalqueError
from calque.models.fleet import HostRegistration
from calque.models.institution import Lab
from calque.models.ledger import LabSpend
from calque.session.broker.audit import BrokerAudit
from calque.session.broker.broker_config import BrokerConfig
from calque.session.broker.broker_ledger import BrokerLedger
from calque.session.broker.demand import FleetDemand, LinkFactory
from calque.session.broker.dispatch import Dispatcher
from calque.session.broker.fairusage import HostRecords
from calque.session.broker.grants import Granter
from calque.session.broker.holding import Holding
from calque.session.broker.hosts import HostCache, HostLink
from calque.session.broker.nudges import NudgeGate
from calque.session.broker.reservations import Reservations, fleet_slices
from calque.session.broker.server import BrokerServer, Identify, Seal
from calque.session.broker.service import BrokerService
from calque.session.broker.store import Store
from calque.session.broker.tcp import TcpIdentify
from calque.session.files import PRIVATE_UMASK

log = logging.getLogger("calque.broker")


@dataclass(frozen=True)
class Institution:
    """What the broker needs of ``institution.yaml``: a link to each host, each lab's Unix groups and
    share, and its own name (what a researcher's credential over TCP is bound to)."""

    links: Mapping[str, HostLink]
    labs: Mapping[str, frozenset[str]]
    shares: Mapping[str, float]
    link: LinkFactory | None = None  # how to reach a host that registers later (an elastic class's)
    budget_labs: tuple[Lab, ...] = ()  # the labs as institution.yaml has them (budgets: broker_ledger.py)
    name: str = "broker"
    hub_user: str | None = None  # the institution's JupyterHub: may ask for a slice for a named user


def _no_link(reg: HostRegistration) -> HostLink:
    raise CalqueError(f"host {reg.name} registered, but this broker was built with no way to reach new hosts")


@dataclass
class Broker:
    config: BrokerConfig
    store: Store
    cache: HostCache
    dispatcher: Dispatcher
    service: BrokerService
    server: BrokerServer
    metrics: exposition.MetricsEndpoint | None = None
    fleet: FleetDemand | None = None
    name: str = "broker"
    audit: BrokerAudit | None = None
    records: HostRecords | None = None  # every host's own sessions, for fair share (fairusage.py)

    @classmethod
    def build(cls, config: BrokerConfig, inst: Institution) -> Broker:
        store = Store(config.db)
        cache = HostCache(inst.links)
        granter = Granter(store, cache, claim_window=config.queue.claim_window)
        dispatcher = Dispatcher(config, store, cache, granter, inst.shares)
        mailer = None
        if config.mail is not None:
            from calque.session.broker.broker_mail import Mailer

            mailer = Mailer(config.mail)
            dispatcher.on_grant, dispatcher.on_tick = mailer.granted, mailer.before_end
        service = BrokerService(store, cache, granter, dispatcher)
        pools = None
        if config.pools is not None:
            from calque.session.broker.pool_budgets import PoolBudgets

            pools = PoolBudgets(config.pools)
        service.ledger = BrokerLedger(store, inst.links, list(inst.budget_labs), mailer, pools)
        service.labs = inst.labs
        service.reservations = Reservations(
            store,
            cache,
            labs=inst.labs,
            managers={lab.name: frozenset(lab.managers) for lab in inst.budget_labs},
            fleet_slices=fleet_slices(config),
            audit=lambda: dispatcher.audit,  # the audit log opens at start
        )
        holding = dispatcher.holding = Holding(store, cache, service.reservations, assumed_ttl=config.queue.assumed_ttl)
        service.reservations.shown = holding.state
        q = config.queue
        records = HostRecords(cache.links, q.fair_share_window, q.usage_every)
        dispatcher.recorded = records.recorded
        server = BrokerServer(config, service, inst.labs, inst.hub_user)
        fleet = None
        if config.fleet is not None:  # elastic classes: demand published and hosts found by a thread of its own
            fleet = FleetDemand(
                config.fleet,
                store,
                cache,
                inst.link or _no_link,
                present=granter.presence.present,
                reservations=service.reservations.all,
            )
            members = fleet.members
            # Its hosts count by their class's ``reservable``, not as fixed hosts (the fleet thread changes it).
            service.reservations.classed = lambda: set(members.copy())
        return cls(config, store, cache, dispatcher, service, server, fleet=fleet, name=inst.name, records=records)

    def start(self) -> None:
        # A first look at every host before anyone is answered, all at once: a host that hangs is
        # left to the loop (its list goes on in the background) after one host_timeout at most.
        looks = [threading.Thread(target=self.cache.refresh, args=(n,), daemon=True) for n in self.cache.names]
        for t in looks:
            t.start()
        deadline = time.monotonic() + self.config.host_timeout
        for t in looks:
            t.join(max(0.0, deadline - time.monotonic()))
        self.dispatcher.start()
        if self.records is not None:
            self.records.start()
        if self.fleet is not None:
            self.fleet.start()
        if self.service.ledger is not None:
            self.service.ledger.start(self.config.ledger_every)
        self.server.bind_unix(self.config.socket)
        audit = self.audit = BrokerAudit(self.config.audit_log)  # refused TCP requests; dropped, expired requests
        self.dispatcher.audit = self.server.audit = audit.event
        if self.config.tcp_addr is not None:
            cache = self.cache

            def service_users() -> dict[str, str]:  # read at each nudge: an elastic host counts once registered
                return {name: getattr(link, "service_user", "root") for name, link in cache.links.items()}

            gate = NudgeGate(
                service_users,
                munge_socket=self.config.munge_socket,
                per_host_per_second=self.config.nudges_per_host_per_second,
            )
            self.server.bind_nudges(self.config.tcp_addr, self.config.tcp_port, gate)
            name, munge_socket, hub_user = self.name, self.config.munge_socket, self.server.hub_user

            def identify(peer: str) -> tuple[Identify, Seal]:
                t = TcpIdentify(name, munge_socket, audit, peer, hub_user)
                return t.identify, t.seal

            self.server.bind_tcp(self.config.tcp_addr, self.config.tcp_port, identify)
        if self.config.metrics_port is not None:
            from calque.session.broker.broker_metrics import collector_registry

            ledger = self.service.ledger

            def budgets() -> list[LabSpend]:  # the ledger's last round: a scrape never asks the hosts
                return ledger.last if ledger is not None else []

            reg = collector_registry(self.store.live, self.config.queue.aging, budgets)
            self.metrics = exposition.serve(reg, self.config.metrics_port, self.config.metrics_addr)
            log.info("metrics on http://%s:%d/metrics", self.metrics.addr, self.metrics.port)
        where = f"{self.config.socket}" + (
            f" and {self.config.tcp_addr}:{self.config.tcp_port} as {self.name}" if self.config.tcp_addr else ""
        )
        log.info("calque broker serving on %s (%d hosts)", where, len(self.cache.names))

    def stop(self) -> None:
        if self.metrics is not None:  # before the store closes: a scrape reads it
            self.metrics.close()
        if self.fleet is not None:
            self.fleet.stop()
        self.server.stop()
        if self.service.ledger is not None:
            self.service.ledger.stop()
        if self.records is not None:
            self.records.stop()
        self.dispatcher.stop()
        self.store.close()
        if self.audit is not None:
            self.audit.close()


def run_broker(config: BrokerConfig, inst: Institution) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.umask(PRIVATE_UMASK)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # every waiting client holds a descriptor
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    broker = Broker.build(config, inst)
    try:
        broker.start()
        stop.wait()
    finally:
        broker.stop()
