"""``calque session serve``: the unix-socket server in front of the session service.

A fixed pool of worker threads all block in ``accept`` on the listening socket (the kernel wakes one
per connection: no hand-off between threads, no thread per request); one request per connection.
The caller is whoever SO_PEERCRED says; no request carries a user name. A request that is garbage,
too large, too slow or abandoned costs one worker for at most ``request_timeout`` and gets an error
back when the peer is still there; other connections wait in the kernel's backlog meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
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

BACKLOG = 512  # a burst of clients queues in the kernel instead of getting EAGAIN


def send(sock: socket.socket, data: bytes) -> None:
    try:
        sock.settimeout(5)
        sock.sendall(data)
    except OSError:
        pass  # the client vanished; nothing to tell it


class _Listener:
    """The listening socket and the workers accepting on it."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.path = daemon.config.socket
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_socket() or self.path.exists():
            self.path.unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        os.chmod(self.path, 0o666)  # world-connectable: SO_PEERCRED says who is calling
        self.sock.listen(BACKLOG)
        self.stopping = False
        self.workers = [
            threading.Thread(target=self._work, name=f"session-worker-{i}", daemon=True)
            for i in range(daemon.config.max_connections)
        ]

    def start(self) -> None:
        for t in self.workers:
            t.start()

    def stop(self) -> None:
        self.stopping = True
        # Wake every worker blocked in accept() with a connection it will drop.
        for _ in self.workers:
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.setblocking(False)
                s.connect(str(self.path))
        for t in self.workers:
            t.join(timeout=2)
        self.sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()

    def _work(self) -> None:
        while not self.stopping:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                if self.stopping:
                    return
                continue
            with conn:
                if self.stopping:
                    return
                try:
                    self._serve(conn)
                except Exception:
                    log.exception("unexpected error serving a connection")

    def _serve(self, sock: socket.socket) -> None:
        d = self.daemon
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
        send(sock, reply)


class Daemon:
    def __init__(self, config: SessionConfig) -> None:
        self.config = config
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
        self._stopping = threading.Event()

    def serve_forever(self) -> None:
        self.service.reconcile()
        listener = _Listener(self)
        listener.start()
        self.enforcer.start()
        metrics_server = None
        if self.config.metrics_port is not None:
            metrics_server = serve_http(self.config.metrics_port, self.service.metrics_text)
        if self.config.metrics_textfile is not None:
            threading.Thread(target=self._textfile_loop, name="metrics-textfile", daemon=True).start()
        log.info("calque session daemon serving on %s (%d slices)", self.config.socket, len(self.service.slices()))
        try:
            while not self._stopping.wait(0.5):
                pass
        finally:
            listener.stop()
            self.enforcer.stop()
            if metrics_server is not None:
                metrics_server.shutdown()
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
