"""The host: what the components of one daemon process share, built once per process and handed to
each of them (service, enforcer, guard, clean-up, metrics), so no component reaches into another.

It holds the config, the registry, the audit log, the GPU reader with the slice inventory over it, the
MPS daemons' last answers, the sessions' cgroups, the node lock (one writer of the capability nodes'
ownership across every process) and the event that wakes the timers. Which process builds what is
``daemon_process.py``'s business: the main process has the timers and no acceptor, a worker the acceptor
and no timers, the metrics process neither.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

from calque.errors import CalqueError
from calque.gpu.backend import GpuReader
from calque.session.daemon.audit import AuditLog, EventTally
from calque.session.daemon.cgroup import SessionCgroups
from calque.session.daemon.hostlock import HostLock
from calque.session.daemon.inventory import SliceInventory, host_root
from calque.session.daemon.mpsdaemons import MpsDaemons
from calque.session.daemon.nudge import Nudger
from calque.session.daemon.registry import Registry
from calque.session.files import lock_path
from calque.session.institution import load_institution
from calque.session.session_config import SessionConfig
from calque.session.slices import load_reader

log = logging.getLogger("calque.session")


@dataclass
class Host:
    config: SessionConfig
    registry: Registry
    audit: AuditLog
    reader: GpuReader | None
    root: Path  # where /dev/nvidia-caps and /proc/driver/nvidia live (the simulator's root in tests)
    nodes_lock: HostLock
    inventory: SliceInventory
    cgroups: SessionCgroups  # where sessions' cgroups live on this host (``cgroups:`` in the config)
    tally: EventTally | None = None  # audit events since the daemon's start (metrics read it)
    # Whether each MPS slot's control daemon answers (a short-lived answer per pipe directory).
    mps: MpsDaemons = field(default_factory=MpsDaemons)
    # Set when a change moves a deadline (a checkout, an extension): the timers look again at once.
    timers_due: threading.Event = field(default_factory=threading.Event)
    # Tells the institution's broker that a slice here was taken or freed (None: no broker).
    broker_nudge: Nudger | None = None

    def changed(self) -> None:
        """A slice was taken or freed: the broker (if any) lists this host at once."""
        if self.broker_nudge is not None:
            self.broker_nudge.send()

    @classmethod
    def build(cls, config: SessionConfig, *, events_from: int | None = None, tally: bool = False) -> Host:
        reader = load_reader(config)
        return cls(
            config=config,
            registry=Registry(config.db),
            audit=AuditLog(config.audit_log),
            reader=reader,
            root=host_root(config, reader),
            nodes_lock=HostLock(lock_path(config.db, "nodes")),
            inventory=SliceInventory(config, reader),
            cgroups=SessionCgroups.from_config(config),
            tally=EventTally(config.audit_log, events_from) if tally else None,
            broker_nudge=_nudger(config),
        )

    def close(self) -> None:
        self.registry.close()
        self.audit.close()


def _nudger(config: SessionConfig) -> Nudger | None:
    """Whom to tell of a slice taken or freed: ``broker_nudge``, else institution.yaml's broker."""
    if config.broker_nudge is None:
        try:
            broker = load_institution(config.institution).broker
        except CalqueError as exc:  # the TCP listener says so where it needs the file; nudges just stop
            log.warning("no nudges to the broker: %s", exc)
            return None
        if broker is None:
            return None
        return Nudger(config.host_name or socket.gethostname(), broker.address, broker.port, config.munge_socket)
    addr, _, port = config.broker_nudge.rpartition(":")
    name = config.host_name or socket.gethostname()
    return Nudger(name, addr.strip("[]"), int(port), config.munge_socket)  # as crosshost.py names it
