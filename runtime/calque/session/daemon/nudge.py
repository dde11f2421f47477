"""A word to the institution's broker that a slice here was taken or freed: one UDP datagram naming
this host, sent without waiting. The broker then lists this host itself (over the authenticated
transport), so the datagram carries nothing to believe; a broker that is down, slow or unreachable
costs the daemon one ``sendto`` and changes nothing here (the broker polls every host anyway)."""

from __future__ import annotations

import contextlib
import socket
import threading


class Nudger:
    def __init__(self, host_name: str, address: str, port: int) -> None:
        self.payload = host_name.encode()
        self.target = (address, port)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    def send(self) -> None:
        with self._lock, contextlib.suppress(OSError):
            if self._sock is None:
                family = socket.AF_INET6 if ":" in self.target[0] else socket.AF_INET
                self._sock = socket.socket(family, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
            self._sock.sendto(self.payload, self.target)
