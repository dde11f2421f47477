"""The listening socket (bound by the main process, inherited by the workers) and, in a worker
process, the front door serving it: each request parsed, its caller named, the service's answer sent."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from pathlib import Path

from calque.session.daemon.frontdoor import Conn, FrontDoor
from calque.session.daemon.service import Service
from calque.session.daemon.wire import RequestError, error, ok, parse_request, quick_request
from calque.session.files import prepare_socket

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


def unbind_socket(sock: socket.socket, path: Path) -> None:
    sock.close()
    with contextlib.suppress(OSError):
        path.unlink()


class Listener:
    """A worker process's front door on the inherited socket, serving ``service``."""

    def __init__(self, service: Service, fd: int) -> None:
        self.service = service
        cfg = service.host.config
        self.sock = socket.socket(fileno=fd)
        self.door = FrontDoor(
            self.sock,
            self._serve,
            threads=cfg.max_connections,
            per_uid=cfg.max_connections_per_uid,
            max_bytes=cfg.max_request_bytes,
            timeout=cfg.request_timeout,
            quick=quick_request,
        )

    def start(self) -> None:
        self.door.start()

    def drain(self, timeout: float) -> None:
        """Stop taking requests and wait (bounded) for those being served."""
        self.door.stopping = True
        deadline = time.monotonic() + timeout
        while self.door.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)

    def _serve(self, conn: Conn, line: bytes) -> bytes:
        svc = self.service
        try:
            req = parse_request(line)
            caller = svc.caller(conn.pid, conn.uid, conn.gid)
            return ok(svc.handle(caller, req.op, req.args))
        except RequestError as exc:
            return error(exc.kind, exc.message)
        except Exception as exc:
            log.exception("request failed")
            return error("internal", f"the session daemon failed: {type(exc).__name__}: {exc}")
