"""``calque session serve``: the unix-socket server in front of the session service.

Threads, one per connection (bounded by ``max_connections``), one request per connection. The
caller is whoever SO_PEERCRED says; no request carries a user name. A request that is garbage,
too large, too slow or abandoned costs one thread for at most ``request_timeout`` and gets an
error back when the peer is still there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import socket
import socketserver
import threading
from types import FrameType

from calque.session.audit import AuditLog
from calque.session.config import SessionConfig
from calque.session.enforcer import Enforcer
from calque.session.inventory import host_root, load_reader
from calque.session.metrics import serve_http, write_textfile
from calque.session.protocol import RequestError, error, ok, parse_request, peer_credentials, read_line
from calque.session.registry import Registry
from calque.session.service import Service

log = logging.getLogger("calque.session")


WORKERS = 64


class _Server(socketserver.UnixStreamServer):
    """Accepts on one thread and hands connections to a fixed pool of workers (no thread per request).

    At most ``max_connections`` connections wait or run at once; beyond that a caller is told to
    retry. A slow client holds one worker for at most ``request_timeout``.
    """

    allow_reuse_address = True
    request_queue_size = 512  # a burst of clients must queue in the kernel, not get EAGAIN
    daemon: Daemon

    def start_workers(self) -> None:
        self.pending: queue.Queue[socket.socket | None] = queue.Queue()
        self.workers = [
            threading.Thread(target=self._work, name=f"session-worker-{i}", daemon=True) for i in range(WORKERS)
        ]
        for t in self.workers:
            t.start()

    def stop_workers(self) -> None:
        for _ in self.workers:
            self.pending.put(None)

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        if not self.daemon.slots.acquire(blocking=False):
            _Handler.send(request, error("busy", "the session daemon is at its connection limit; retry in a moment"))
            self.shutdown_request(request)
            return
        self.pending.put(request)

    def _work(self) -> None:
        while True:
            request = self.pending.get()
            if request is None:
                return
            try:
                _Handler(request, "", self)
            except Exception:
                log.exception("unexpected error serving a connection")
            finally:
                self.daemon.slots.release()
                self.shutdown_request(request)


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        self._serve(self.server.daemon, self.request)

    def _serve(self, d: Daemon, sock: socket.socket) -> None:
        cfg = d.config
        try:
            pid, uid, gid = peer_credentials(sock)
            line = read_line(sock, cfg.max_request_bytes, cfg.request_timeout)
            req = parse_request(line)
            caller = d.service.caller(pid, uid, gid)
            result = d.service.handle(caller, req.op, req.args)
            reply = ok(result)
        except RequestError as exc:
            reply = error(exc.kind, exc.message)
        except Exception as exc:
            log.exception("request failed")
            reply = error("internal", f"the session daemon failed: {type(exc).__name__}: {exc}")
        self.send(sock, reply)

    @staticmethod
    def send(sock: socket.socket, data: bytes) -> None:
        try:
            sock.settimeout(5)
            sock.sendall(data)
        except OSError:
            pass  # the client vanished; nothing to tell it


class Daemon:
    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self.slots = threading.BoundedSemaphore(config.max_connections)
        self.registry = Registry(config.db)
        self.audit = AuditLog(config.audit_log)
        self.reader = load_reader(config)
        self.service = Service(
            config=config,
            registry=self.registry,
            audit=self.audit,
            reader=self.reader,
            host_root=host_root(config, self.reader),
        )
        self.enforcer = Enforcer(self.service)
        self.service.wake = self.enforcer.wake
        self.service.reclaim = self.enforcer.reclaim_after_end
        self._server: _Server | None = None
        self._stopping = threading.Event()

    def bind(self) -> None:
        path = self.config.socket
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_socket() or path.exists():
            path.unlink()
        server = _Server(str(path), _Handler, bind_and_activate=False)
        server.daemon = self
        server.server_bind()
        os.chmod(path, 0o666)  # world-connectable: SO_PEERCRED says who is calling
        server.server_activate()
        server.start_workers()
        self._server = server

    def serve_forever(self) -> None:
        self.service.reconcile()
        self.bind()
        self.enforcer.start()
        metrics_server = None
        if self.config.metrics_port is not None:
            metrics_server = serve_http(self.config.metrics_port, self.service.metrics_text)
        if self.config.metrics_textfile is not None:
            threading.Thread(target=self._textfile_loop, name="metrics-textfile", daemon=True).start()
        log.info("calque session daemon serving on %s (%d slices)", self.config.socket, len(self.service.slices()))
        assert self._server is not None
        try:
            self._server.serve_forever(poll_interval=0.2)
        finally:
            self.enforcer.stop()
            self._server.stop_workers()
            if metrics_server is not None:
                metrics_server.shutdown()
            self._server.server_close()
            with contextlib.suppress(OSError):
                self.config.socket.unlink()
            self.registry.close()
            self.audit.close()

    def _textfile_loop(self) -> None:
        assert self.config.metrics_textfile is not None
        while True:
            try:
                write_textfile(self.config.metrics_textfile, self.service.metrics_text())
            except OSError as exc:
                log.error("cannot write metrics textfile: %s", exc)
            if self._stopping.wait(10):
                return

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            threading.Thread(target=self._server.shutdown, daemon=True).start()


def run_daemon(config: SessionConfig) -> None:
    """Serve until SIGTERM/SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.umask(0o022)
    d = Daemon(config)

    def _stop(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: shutting down", signum)
        d.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    d.serve_forever()
