"""``calque session broker``: one process holding the queue file, the host cache, the loop and the
sockets, built from the config and the institution (hosts, labs, shares) it is handed."""

from __future__ import annotations

import logging
import os
import resource
import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType

from calque.session.broker.audit import BrokerAudit
from calque.session.broker.dispatch import Dispatcher
from calque.session.broker.grants import Granter
from calque.session.broker.hosts import HostCache, HostLink
from calque.session.broker.server import BrokerServer, Identify, Seal
from calque.session.broker.service import BrokerService
from calque.session.broker.store import Store
from calque.session.broker.tcp import TcpIdentify
from calque.session.brokerconfig import BrokerConfig
from calque.session.files import PRIVATE_UMASK

log = logging.getLogger("calque.broker")


@dataclass(frozen=True)
class Institution:
    """What the broker needs of ``institution.yaml``: a link to each host, each lab's Unix groups and
    share, and its own name (what a researcher's credential over TCP is bound to)."""

    links: Mapping[str, HostLink]
    labs: Mapping[str, frozenset[str]]
    shares: Mapping[str, float]
    name: str = "broker"


@dataclass
class Broker:
    config: BrokerConfig
    store: Store
    cache: HostCache
    dispatcher: Dispatcher
    service: BrokerService
    server: BrokerServer
    name: str = "broker"
    audit: BrokerAudit | None = None

    @classmethod
    def build(cls, config: BrokerConfig, inst: Institution) -> Broker:
        store = Store(config.db)
        cache = HostCache(inst.links)
        granter = Granter(store, cache, claim_window=config.queue.claim_window)
        dispatcher = Dispatcher(config, store, cache, granter, inst.shares)
        if config.mail is not None:
            from calque.session.broker.mail import Mailer

            mailer = Mailer(config.mail)
            dispatcher.on_grant, dispatcher.on_tick = mailer.granted, mailer.before_end
        service = BrokerService(store, cache, granter, dispatcher)
        server = BrokerServer(config, service, inst.labs)
        return cls(config, store, cache, dispatcher, service, server, name=inst.name)

    def start(self) -> None:
        for name in self.cache.names:  # a first look at every host before anyone is answered
            self.cache.refresh(name)
        self.dispatcher.start()
        self.server.bind_unix(self.config.socket)
        if self.config.tcp_addr is not None:
            self.server.bind_nudges(self.config.tcp_addr, self.config.tcp_port)
            audit = self.audit = BrokerAudit(self.config.audit_log)
            name, munge_socket = self.name, self.config.munge_socket

            def identify(peer: str) -> tuple[Identify, Seal]:
                t = TcpIdentify(name, munge_socket, audit, peer)
                return t.identify, t.seal

            self.server.bind_tcp(self.config.tcp_addr, self.config.tcp_port, identify)
        where = f"{self.config.socket}" + (
            f" and {self.config.tcp_addr}:{self.config.tcp_port} as {self.name}" if self.config.tcp_addr else ""
        )
        log.info("calque broker serving on %s (%d hosts)", where, len(self.cache.names))

    def stop(self) -> None:
        self.server.stop()
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
