"""The listening sockets (bound by the main process, inherited by the workers) and, in a worker
process, the fair acceptors serving them: each request parsed, its caller named, the service's answer
sent. The unix socket's caller is whoever SO_PEERCRED says; the TCP socket's (``listen_tcp``) is whom
the request's munge credential vouches for (``crosshost.py``)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import zlib
from functools import partial
from pathlib import Path

from calque.session.daemon.acceptor import Conn, FairAcceptor
from calque.session.daemon.service import Service
from calque.session.daemon.wire import RequestError, error, ok, parse_request, quick_request
from calque.session.files import prepare_socket
from calque.session.session_config import TcpListen

log = logging.getLogger("calque.session")

BACKLOG = 512  # a burst of clients queues in the kernel instead of getting EAGAIN


def bind_socket(path: Path) -> socket.socket:
    """The main process's listening socket: world-connectable (SO_PEERCRED says who is calling)."""
    prepare_socket(path)  # a checked directory; a stale socket or symlink is unlinked
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, 0o666)
    sock.listen(BACKLOG)
    return sock


def bind_tcp(listen: TcpListen) -> socket.socket:
    """The main process's TCP socket for requests from other hosts (each carries a munge credential)."""
    family = socket.AF_INET6 if ":" in listen.address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((listen.address, listen.port))
    sock.listen(BACKLOG)
    return sock


def _address_key(sock: socket.socket) -> tuple[int, int, int]:
    """A TCP connection's key for the acceptor's per-client bound and fair queue: its address, as a
    negative number (never a uid). The caller's identity comes later, from its credential."""
    try:
        host = sock.getpeername()[0]
    except OSError:
        host = "?"
    return 0, -1 - (zlib.crc32(host.encode()) & 0x7FFFFFFF), 0


def unbind_socket(sock: socket.socket, path: Path) -> None:
    sock.close()
    with contextlib.suppress(OSError):
        path.unlink()


class Listener:
    """A worker process's acceptor on the inherited socket, serving ``service``."""

    def __init__(self, service: Service, fd: int, tcp_fd: int | None = None) -> None:
        self.service = service
        cfg = service.host.config
        self.sock = socket.socket(fileno=fd)
        self.tcp: FairAcceptor | None = None
        # both sockets' acceptors share the config's bounds; each has its own per-caller share
        acceptor = partial(
            FairAcceptor,
            threads=cfg.max_connections,
            max_bytes=cfg.max_request_bytes,
            timeout=cfg.request_timeout,
            quick=quick_request,
        )
        if tcp_fd is not None:
            from calque.session.daemon.crosshost import CrossHost
            from calque.session.institution import load_institution

            self.crosshost = CrossHost(service, load_institution(cfg.institution))
            tcp = socket.socket(fileno=tcp_fd)
            self.tcp = acceptor(tcp, self._serve_tcp, per_uid=cfg.max_tcp_connections, identify=_address_key)
        self.acceptor = acceptor(self.sock, self._serve, per_uid=cfg.max_connections_per_uid)

    def start(self) -> None:
        self.acceptor.start()
        if self.tcp is not None:
            self.tcp.start()

    def drain(self, timeout: float) -> None:
        """Stop taking requests and wait (bounded) for those being served."""
        acceptors = [self.acceptor] if self.tcp is None else [self.acceptor, self.tcp]
        for acceptor in acceptors:
            acceptor.stopping = True
        deadline = time.monotonic() + timeout
        while any(d.in_flight for d in acceptors) and time.monotonic() < deadline:
            time.sleep(0.01)

    def _serve(self, conn: Conn, line: bytes) -> bytes:
        svc = self.service
        try:
            req = parse_request(line)
            caller = svc.caller(conn.pid, conn.uid, conn.gid)
            if req.broker or req.as_user is not None:  # the broker on this machine (broker/local.py)
                caller = svc.from_broker(caller, req.as_user)
            return ok(svc.handle(caller, req.op, req.args))
        except RequestError as exc:
            return error(exc.kind, exc.message)
        except Exception as exc:
            log.exception("request failed")
            return error("internal", f"the session daemon failed: {type(exc).__name__}: {exc}")

    def _serve_tcp(self, conn: Conn, line: bytes) -> bytes:
        try:
            peer = conn.sock.getpeername()[0]
        except OSError:
            peer = "?"
        try:
            reply = ok(self.crosshost.serve(line, peer))
        except RequestError as exc:
            reply = error(exc.kind, exc.message)
        except Exception as exc:
            log.exception("request from %s failed", peer)
            reply = error("internal", f"the session daemon failed: {type(exc).__name__}: {exc}")
        return reply + self.crosshost.seal(line, reply[:-1])  # the sender believes only a sealed answer
