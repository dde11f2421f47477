"""A word to the institution's broker that a slice here was taken or freed: one UDP datagram, a munge
credential this daemon's process makes (so of its service user) whose payload names this host, sent
without waiting. The broker then lists this host itself (over the authenticated transport); the
credential only keeps anyone else from making it do so (``broker/nudges.py``). A broker that is down,
slow or unreachable costs the daemon one ``sendto`` and changes nothing here (the broker polls every
host anyway); so does a munged that is down (the nudge is not sent, and said once)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from pathlib import Path

from calque.models.institution import NUDGE_PREFIX
from calque.session import munge

log = logging.getLogger("calque.session")


class Nudger:
    def __init__(self, host_name: str, address: str, port: int, munge_socket: Path | None = None) -> None:
        self.payload = NUDGE_PREFIX + host_name.encode()
        self.target = (address, port)
        self.munge_socket = munge_socket
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._warned = False

    def send(self) -> None:
        try:
            datagram = munge.encode(self.payload, socket=self.munge_socket, ttl=60).encode("ascii")
        except (munge.MungeError, munge.MungeUnavailable) as exc:
            if not self._warned:
                self._warned = True
                log.warning("cannot sign nudges to the broker (it finds changes here by its poll): %s", exc)
            return
        with self._lock, contextlib.suppress(OSError):
            if self._sock is None:
                family = socket.AF_INET6 if ":" in self.target[0] else socket.AF_INET
                self._sock = socket.socket(family, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
            self._sock.sendto(datagram, self.target)
