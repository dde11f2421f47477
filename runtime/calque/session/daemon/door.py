"""The institution's queue is the one door: who may check out directly on this host, and when.

On a host whose ``institution.yaml`` names a broker, a checkout keeps the broker's order: while the
broker answers, the daemon serves a checkout only from the broker (its service user, acting for the
user it names) and refuses anyone else's, naming the command to use. The broker lists every host
every few seconds, so "the broker answers" is "the broker asked this host within ``degraded_after``";
each request from it marks the time in a file beside the registry (every worker process reads the
same mark). Past that bound the host is in degraded mode: it serves checkouts directly again, each
one audited as such, and ``list``/``status`` say so; its sessions are in its registry like any other,
so the broker's fair share counts them when it lists the host's ledger again.

An admin may check out past the queue (``checkout --direct``): audited. Root on this machine is the
broker's service user by default (the local path, ``broker/local.py``), so root is never refused.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import time
from datetime import datetime, timezone

from calque.errors import CalqueError
from calque.models.institution import Broker
from calque.models.session_answers import BrokerPlace, DoorMode, DoorState
from calque.session.daemon.audit import AuditLog
from calque.session.institution import load_institution
from calque.session.session_config import SessionConfig

MARK_EVERY_S = 1.0  # a busy broker's requests touch the mark at most this often per process


class Door:
    def __init__(self, config: SessionConfig, audit: AuditLog) -> None:
        self.config = config
        self.audit = audit
        self.host = config.host_name or socket.gethostname()
        self.bound = float(config.degraded_after)
        try:
            self.broker: Broker | None = load_institution(config.institution).broker
        except CalqueError:
            self.broker = None  # a broken file: the TCP listener reports it; checkouts are served here
        name = self.broker.service_user if self.broker is not None else "root"
        try:
            self.broker_uid = pwd.getpwnam(name).pw_uid
        except KeyError:
            self.broker_uid = 0
        self.mark = config.db.parent / "locks" / f"{config.db.name}.broker-heard"
        self.started = time.time()  # a daemon that just started gives the broker the bound to call
        self._marked = 0.0
        self._degraded = False  # as this process last saw it: the change is audited once per process

    def is_broker(self, uid: int) -> bool:
        return uid == self.broker_uid

    def heard(self) -> None:
        """The broker asked this host something: it answers."""
        now = time.monotonic()
        if now - self._marked < MARK_EVERY_S:
            return
        self._marked = now
        with contextlib.suppress(OSError):
            self.mark.touch(mode=0o600)
            os.utime(self.mark)

    def _heard_at(self) -> float:
        try:
            return max(self.mark.stat().st_mtime, self.started)
        except OSError:
            return self.started

    def state(self) -> DoorState:
        if self.broker is None:
            return DoorState(mode="direct", host=self.host, degraded_after=self.bound)
        at = self._heard_at()
        silent = max(0.0, time.time() - at)
        mode: DoorMode = "degraded" if silent >= self.bound else "queue"
        if (mode == "degraded") != self._degraded:
            self._degraded = mode == "degraded"
            event = "door_degraded" if self._degraded else "door_restored"
            self.audit.event(event, broker=self.broker.name, silent_for=round(silent, 1), bound=self.bound)
        b = self.broker
        return DoorState(
            mode=mode,
            host=self.host,
            broker=BrokerPlace(name=b.name, address=b.address, port=b.port, service_user=b.service_user),
            degraded_after=self.bound,
            silent_for=silent,
            heard_at=datetime.fromtimestamp(at, timezone.utc),
        )

    def refusal(self, state: DoorState) -> str:
        assert state.broker is not None
        return (
            f"{self.host} takes checkouts through the institution's queue while its broker "
            f"({state.broker.name}) answers: run `calque session checkout` (it asks the broker for a slice "
            "here, in the queue's order; --wait joins the queue) with this version of calque, or "
            f"`calque session checkout --anywhere` for any host; the host serves checkouts directly again "
            f"only once the broker has been silent for {self.bound:g} s"
        )
