"""Prometheus exposition for calque's long-running processes: a bounded HTTP endpoint and textfiles.

Metrics are ``prometheus_client`` collectors in a ``CollectorRegistry``; rendering is the library's.
The endpoint is served by ONE thread, one connection at a time, with a small listen backlog and a
per-connection timeout: an idle or slow client holds the endpoint for at most ``timeout_s`` and can
never exhaust the process it reports on (no thread per connection). Hosts that run node_exporter can
use its textfile collector instead: ``write_textfile`` replaces a ``*.prom`` file atomically.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app, write_to_textfile

from calque.errors import UsageError

DEFAULT_ADDR = "127.0.0.1"
_BACKLOG = 8
_TIMEOUT_S = 5.0


def check_addr(addr: str) -> str:
    """An IP address to bind the endpoint to (loopback by default; 0.0.0.0 or a host address to expose it)."""
    try:
        return str(ipaddress.ip_address(addr))
    except ValueError:
        raise UsageError(
            f"metrics address {addr!r} is not an IP address: use 127.0.0.1, 0.0.0.0 or a host's IP"
        ) from None


class _Server(WSGIServer):
    request_queue_size = _BACKLOG
    timeout_s = _TIMEOUT_S

    def __init__(self, addr: tuple[str, int], handler: type[WSGIRequestHandler]) -> None:
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        super().__init__(addr, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, peer = super().get_request()
        conn.settimeout(self.timeout_s)  # a client that sends nothing is dropped after timeout_s
        return conn, peer

    def handle_error(self, request: Any, client_address: Any) -> None:
        return None  # a client that timed out or went away: nothing to report


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


@dataclass
class MetricsEndpoint:
    """A running endpoint: its bound address and port; ``close`` stops it."""

    addr: str
    port: int
    _server: _Server
    _thread: threading.Thread

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=_TIMEOUT_S + 1)


def serve(
    registry: CollectorRegistry, port: int, addr: str = DEFAULT_ADDR, *, name: str = "calque-metrics"
) -> MetricsEndpoint:
    """Serve ``registry`` on ``http://addr:port/metrics`` (port 0 picks a free one) from one thread."""
    app = make_wsgi_app(registry)
    try:
        server = make_server(check_addr(addr), port, app, server_class=_Server, handler_class=_QuietHandler)
    except OSError as exc:
        raise UsageError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from exc
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name=name, daemon=True)
    thread.start()
    return MetricsEndpoint(addr, int(server.server_address[1]), server, thread)


def write_textfile(registry: CollectorRegistry, path: str | os.PathLike[str]) -> None:
    """Atomically replace ``path`` (node_exporter's textfile collector reads ``*.prom`` in its directory)."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"metrics textfile {target} is a directory: name a file in it, e.g. {target}/calque.prom")
    write_to_textfile(str(target), registry)
