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
import subprocess
import sys
import threading
import time
from types import FrameType

from calque.errors import CalqueError
from calque.session.audit import AuditLog, EventTally
from calque.session.config import SessionConfig
from calque.session.enforcer import Enforcer
from calque.session.inventory import host_root, load_reader
from calque.session.protocol import RequestError, error, ok, parse_request, peer_credentials, read_line
from calque.session.registry import HostLock, Registry
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

    def __init__(self, daemon: Daemon, inherited_fd: int | None = None, threads: bool = True) -> None:
        self.daemon = daemon
        self.path = daemon.config.socket
        self.owner = inherited_fd is None  # the process that bound the socket unlinks it
        if inherited_fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.is_socket() or self.path.exists():
                self.path.unlink()
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.bind(str(self.path))
            os.chmod(self.path, 0o666)  # world-connectable: SO_PEERCRED says who is calling
            self.sock.listen(BACKLOG)
        else:
            self.sock = socket.socket(fileno=inherited_fd)
        self.stopping = False
        self.in_flight = 0
        self._count_lock = threading.Lock()
        self.workers = [
            threading.Thread(target=self._work, name=f"session-worker-{i}", daemon=True)
            for i in range(daemon.config.max_connections if threads else 0)
        ]

    def start(self) -> None:
        for t in self.workers:
            t.start()

    def drain(self, timeout: float) -> None:
        """Stop taking requests and wait (bounded) for those being served (worker processes)."""
        self.stopping = True
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self) -> None:
        self.stopping = True
        if not self.owner:
            return
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
                with self._count_lock:
                    self.in_flight += 1
                try:
                    self._serve(conn)
                except Exception:
                    log.exception("unexpected error serving a connection")
                finally:
                    with self._count_lock:
                        self.in_flight -= 1

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
            tally=EventTally(config.audit_log),
            nodes_lock=HostLock(config.db.with_name(config.db.name + ".nodes.lock")),
        )
        self.enforcer = Enforcer(self.service)
        self.service.wake = self.enforcer.wake
        self.service.reclaim = self.enforcer.reclaim_after_end
        self._stopping = threading.Event()

    def serve_forever(self) -> None:
        self.service.reconcile()
        multi = self.config.processes > 1
        listener = _Listener(self, threads=not multi)
        listener.start()
        children: list[subprocess.Popen[bytes]] = []
        if multi:
            children = [self._spawn(listener.sock.fileno()) for _ in range(self.config.processes)]
        self.enforcer.start()
        metrics_server = None
        if self.config.metrics_port is not None:  # one bounded thread: idle clients cannot exhaust the daemon
            from calque import exposition
            from calque.session.metrics import registry_of

            reg = registry_of(self.service)
            metrics_server = exposition.serve(reg, self.config.metrics_port, self.config.metrics_addr, name="metrics")
        if self.config.metrics_textfile is not None:
            threading.Thread(target=self._textfile_loop, name="metrics-textfile", daemon=True).start()
        log.info("calque session daemon serving on %s (%d slices)", self.config.socket, len(self.service.slices()))
        try:
            while not self._stopping.wait(0.5):
                for i, child in enumerate(children):
                    if child.poll() is not None:
                        log.error("worker process %d exited with %s; starting another", child.pid, child.returncode)
                        children[i] = self._spawn(listener.sock.fileno())
        finally:
            for child in children:
                child.terminate()
            for child in children:
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait(5)
            listener.stop()
            self.enforcer.stop()
            if metrics_server is not None:
                metrics_server.close()
            self.registry.close()
            self.audit.close()

    def _spawn(self, fd: int) -> subprocess.Popen[bytes]:
        """A worker process serving requests on the inherited listening socket (timers stay here)."""
        env = {
            **os.environ,
            _ENV_CONFIG: self.config.model_dump_json(),
            _ENV_FD: str(fd),
            _ENV_PARENT: str(os.getpid()),
        }
        return subprocess.Popen(
            [sys.executable, "-c", "from calque.session.daemon import worker_main; worker_main()"],
            pass_fds=(fd,),
            env=env,
        )

    def _textfile_loop(self) -> None:
        from calque import exposition
        from calque.session.metrics import registry_of

        assert self.config.metrics_textfile is not None
        while True:
            try:
                exposition.write_textfile(registry_of(self.service), self.config.metrics_textfile)
            except (OSError, CalqueError) as exc:
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


_ENV_CONFIG = "CALQUE_SESSION_WORKER_CONFIG"
_ENV_FD = "CALQUE_SESSION_WORKER_FD"
_ENV_PARENT = "CALQUE_SESSION_WORKER_PARENT"


def worker_main() -> None:
    """A worker process of ``processes > 1``: serve requests on the parent's socket until told to
    stop or until the parent is gone (then finish what is in flight and exit)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    os.umask(0o022)
    config = SessionConfig.model_validate_json(os.environ.pop(_ENV_CONFIG))
    fd = int(os.environ.pop(_ENV_FD))
    # The pid we were started by, not getppid() now: the main process may already be gone.
    parent = int(os.environ.pop(_ENV_PARENT, str(os.getppid())))
    d = Daemon(config)
    listener = _Listener(d, inherited_fd=fd)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    d.enforcer.start_cleanup()
    listener.start()
    while not stop.wait(0.2):
        if os.getppid() != parent:
            log.warning("the session daemon's main process is gone; worker %d exits", os.getpid())
            break
    listener.drain(5.0)
    d.audit.close()
    os._exit(0)  # worker threads are blocked in accept() on the shared socket; do not wait for them
