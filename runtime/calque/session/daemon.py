"""``calque session serve``: the unix-socket server in front of the session service.

Enforcement first: the main process binds the socket and runs the timers and reclaims; it serves no
client. ``processes`` worker processes serve requests through the front door (``frontdoor.py``: one
thread accepts and reads without blocking, per-uid connection limits, worker threads taken round
robin across uids), and metrics, when configured, come from a process of their own. The caller is
whoever SO_PEERCRED says; no request carries a user name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from calque.errors import CalqueError
from calque.session.audit import AuditLog, EventTally
from calque.session.config import SessionConfig
from calque.session.enforcer import Enforcer
from calque.session.files import PRIVATE_UMASK, lock_path, prepare_socket
from calque.session.frontdoor import Conn, FrontDoor
from calque.session.inventory import host_root, load_reader
from calque.session.protocol import RequestError, error, ok, parse_request, quick_request
from calque.session.registry import HostLock, Registry
from calque.session.service import Service

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("calque.session")

BACKLOG = 512  # a burst of clients queues in the kernel instead of getting EAGAIN


class _Listener:
    """The listening socket and, in a worker process, the front door serving it."""

    def __init__(self, daemon: Daemon, inherited_fd: int | None = None) -> None:
        self.daemon = daemon
        cfg = daemon.config
        self.path = cfg.socket
        self.owner = inherited_fd is None  # the process that bound the socket unlinks it
        if inherited_fd is None:
            prepare_socket(self.path)  # a checked directory; a stale socket or symlink is unlinked
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.bind(str(self.path))
            os.chmod(self.path, 0o666)  # world-connectable: SO_PEERCRED says who is calling
            self.sock.listen(BACKLOG)
        else:
            self.sock = socket.socket(fileno=inherited_fd)
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
        """Stop taking requests and wait (bounded) for those being served (worker processes)."""
        self.door.stopping = True
        deadline = time.monotonic() + timeout
        while self.door.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self) -> None:
        if self.door.workers and self.door.workers[0].is_alive():
            self.door.stop()
        if not self.owner:
            return
        self.sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()

    def _serve(self, conn: Conn, line: bytes) -> bytes:
        d = self.daemon
        try:
            req = parse_request(line)
            caller = d.service.caller(conn.pid, conn.uid, conn.gid)
            return ok(d.service.handle(caller, req.op, req.args))
        except RequestError as exc:
            return error(exc.kind, exc.message)
        except Exception as exc:
            log.exception("request failed")
            return error("internal", f"the session daemon failed: {type(exc).__name__}: {exc}")


class Daemon:
    def __init__(self, config: SessionConfig, events_from: int | None = None) -> None:
        self.config = config
        self.registry = Registry(config.db)
        self.audit = AuditLog(config.audit_log)
        self.reader = load_reader(config)
        self.events = EventTally(config.audit_log, events_from)
        self.service = Service(
            config=config,
            registry=self.registry,
            audit=self.audit,
            reader=self.reader,
            host_root=host_root(config, self.reader),
            tally=self.events,
            nodes_lock=HostLock(lock_path(config.db, "nodes")),
        )
        self.enforcer = Enforcer(self.service)
        self.service.wake = self.enforcer.wake
        self.service.reclaim = self.enforcer.reclaim_after_end
        self._stopping = threading.Event()

    def serve_forever(self) -> None:
        """The main process serves no client: it binds the socket, runs the timers and reclaims, and
        keeps the worker processes (and the metrics process) running."""
        self.service.reconcile()
        raise_descriptor_limit()
        listener = _Listener(self)
        fd = listener.sock.fileno()
        roles = ["worker_main"] * self.config.processes
        if self.config.metrics_port is not None or self.config.metrics_textfile is not None:
            roles.append("metrics_main")
        children = [self._spawn(role, fd) for role in roles]
        self.enforcer.start()
        log.info("calque session daemon serving on %s (%d slices)", self.config.socket, len(self.service.slices()))
        try:
            while not self._stopping.wait(0.5):
                for i, child in enumerate(children):
                    if child.poll() is not None:
                        log.error(
                            "%s process %d exited with %s; starting another", roles[i], child.pid, child.returncode
                        )
                        children[i] = self._spawn(roles[i], fd)
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
            self.registry.close()
            self.audit.close()

    def _spawn(self, entry: str, fd: int) -> subprocess.Popen[bytes]:
        """A child process: a worker serving requests on the inherited socket, or the metrics server."""
        env = {**os.environ, _ENV_CONFIG: self.config.model_dump_json(), _ENV_PARENT: str(os.getpid())}
        env[_ENV_EVENTS_FROM] = str(self.events.start)  # events count from the daemon's start
        worker = entry == "worker_main"
        if worker:
            env[_ENV_FD] = str(fd)
        return subprocess.Popen(
            [sys.executable, "-c", f"from calque.session.daemon import {entry}; {entry}()"],
            pass_fds=(fd,) if worker else (),
            env=env,
        )

    def stop(self) -> None:
        self._stopping.set()


def run_daemon(config: SessionConfig) -> None:
    """Serve until SIGTERM/SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.umask(PRIVATE_UMASK)
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
_ENV_EVENTS_FROM = "CALQUE_SESSION_EVENTS_FROM"


def _child_setup() -> tuple[SessionConfig, int, int | None]:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    os.umask(PRIVATE_UMASK)
    config = SessionConfig.model_validate_json(os.environ.pop(_ENV_CONFIG))
    # The pid we were started by, not getppid() now: the main process may already be gone.
    parent = int(os.environ.pop(_ENV_PARENT, str(os.getppid())))
    events_from = os.environ.pop(_ENV_EVENTS_FROM, None)
    return config, parent, int(events_from) if events_from is not None else None


def _until_told_or_orphaned(stop: threading.Event, parent: int) -> None:
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while not stop.wait(0.2):
        if os.getppid() != parent:
            log.warning("the session daemon's main process is gone; process %d exits", os.getpid())
            return


def worker_main() -> None:
    """A worker process: serve requests on the parent's socket until told to stop or until the
    parent is gone (then finish what is in flight and exit)."""
    config, parent, events_from = _child_setup()
    fd = int(os.environ.pop(_ENV_FD))
    raise_descriptor_limit()
    d = Daemon(config, events_from)
    listener = _Listener(d, inherited_fd=fd)
    d.enforcer.start_cleanup()
    listener.start()
    _until_told_or_orphaned(threading.Event(), parent)
    listener.drain(5.0)
    d.audit.close()
    os._exit(0)  # worker threads may be mid-request; do not wait for them


def metrics_main() -> None:
    """The metrics process: prometheus_client's one-thread server (bounded backlog, per-connection
    timeout) and/or the textfile, apart from the timers and from the request workers."""
    from calque import exposition
    from calque.session.metrics import registry_of

    config, parent, events_from = _child_setup()
    d = Daemon(config, events_from)
    reg = registry_of(d.service)
    server = None
    if config.metrics_port is not None:
        server = exposition.serve(reg, config.metrics_port, config.metrics_addr, name="metrics")
    stop = threading.Event()
    if config.metrics_textfile is not None:
        threading.Thread(target=_textfile_loop, args=(reg, config.metrics_textfile, stop), daemon=True).start()
    _until_told_or_orphaned(stop, parent)
    stop.set()
    if server is not None:
        server.close()
    os._exit(0)


def _textfile_loop(reg: CollectorRegistry, path: Path, stop: threading.Event) -> None:
    from calque import exposition

    while True:
        try:
            exposition.write_textfile(reg, path)
        except (OSError, CalqueError) as exc:
            log.error("cannot write metrics textfile: %s", exc)
        if stop.wait(10):
            return


def raise_descriptor_limit() -> None:
    """Idle connections cost descriptors: take the hard limit (per-uid limits bound the rest)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
