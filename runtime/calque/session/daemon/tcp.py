"""The daemon's TCP port (``listen_tcp``): requests from other hosts, each vouched for by munge.

The main process binds it and the worker processes serve it beside the unix socket. A connection
carries one request, bounded in size and time like the unix socket's; at most ``max_connections``
are served at once per worker (a thread each), and one more gets ``refused`` at once. No caller is
known before its credential is checked (``crossing.py``), so nothing here is per user.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time

from calque.session.config import ListenTcp
from calque.session.daemon.crossing import Crossing
from calque.session.daemon.service import Service
from calque.session.daemon.wire import RequestError, error, ok, read_line

log = logging.getLogger("calque.session")

BACKLOG = 128


def bind_tcp(listen: ListenTcp) -> socket.socket:
    family = socket.AF_INET6 if ":" in listen.address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((listen.address, listen.port))
    sock.listen(BACKLOG)
    return sock


class TcpListener:
    """A worker's server of the inherited TCP socket ``fd``, for ``service``."""

    def __init__(self, service: Service, fd: int) -> None:
        cfg = service.host.config
        assert cfg.listen_tcp is not None
        self.service = service
        self.sock = socket.socket(fileno=fd)
        self.max_bytes = cfg.max_request_bytes + 16 * 1024  # room for the credential
        self.timeout = cfg.request_timeout
        self.slots = threading.BoundedSemaphore(cfg.listen_tcp.max_connections)
        self.crossing = Crossing(
            service.host.name,
            service.identities,
            service.host.audit,
            broker_users=cfg.listen_tcp.broker_users,
            munge_socket=cfg.munge_socket,
        )
        self.stopping = False
        self._thread = threading.Thread(target=self._accept_loop, name="tcp-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _accept_loop(self) -> None:
        self.sock.settimeout(0.5)  # the stop flag is looked at twice a second
        while not self.stopping:
            try:
                conn, addr = self.sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                log.error("accepting a TCP connection failed: %s", exc)
                time.sleep(0.05)
                continue
            peer = f"{addr[0]}:{addr[1]}"
            if not self.slots.acquire(blocking=False):
                with contextlib.suppress(OSError):
                    conn.settimeout(1)
                    conn.sendall(error("refused", "the session daemon is serving too many hosts' requests; retry"))
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        try:
            try:
                line = read_line(conn, self.max_bytes, self.timeout)
                reply = self.answer(line, peer)
            except RequestError as exc:
                reply = error(exc.kind, exc.message)
            conn.settimeout(5)
            conn.sendall(reply)
        except OSError:
            pass  # the peer went away: nothing to tell it
        except Exception:
            log.exception("unexpected error serving a TCP connection from %s", peer)
        finally:
            conn.close()
            self.slots.release()

    def answer(self, line: bytes, peer: str) -> bytes:
        req = self.crossing.parse(line, peer)
        caller = self.crossing.caller(req, peer)
        try:
            return ok(self.service.handle(caller, req.op, req.args))
        except RequestError:
            raise
        except Exception as exc:
            log.exception("request from %s failed", peer)
            return error("internal", f"the session daemon failed: {type(exc).__name__}: {exc}")
