"""``calque session serve``: the daemon's processes, each building only what it serves.

* The main process binds the socket, runs the timers and reclaims (``Enforcer``, with the node guard)
  and keeps the other processes running; it serves no client.
* ``processes`` worker processes serve requests on the inherited socket through the fair acceptor
  (``listener.py``, ``acceptor.py``): a ``Service`` and the check-in clean-up; no timers.
* The metrics process (when metrics are on) serves the port and/or writes the textfile: the
  registry, the slice inventory and the audit events; no socket, no service.

Each builds its own ``Host`` (``host.py``) and hands it to what it runs. The caller is whoever
SO_PEERCRED says; no request carries a user name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType

from calque.errors import CalqueError
from calque.session.daemon.audit import EventTally
from calque.session.daemon.cleanup import Cleanup
from calque.session.daemon.enforcer import Enforcer
from calque.session.daemon.guard import NodeGuard
from calque.session.daemon.host import Host
from calque.session.daemon.listener import Listener, bind_socket, bind_tcp, unbind_socket
from calque.session.daemon.nodes import reconcile
from calque.session.daemon.service import Service
from calque.session.files import PRIVATE_UMASK
from calque.session.session_config import SessionConfig

log = logging.getLogger("calque.session")

_ENV_CONFIG = "CALQUE_SESSION_WORKER_CONFIG"
_ENV_FD = "CALQUE_SESSION_WORKER_FD"
_ENV_TCP_FD = "CALQUE_SESSION_WORKER_TCP_FD"
_ENV_PARENT = "CALQUE_SESSION_WORKER_PARENT"
_ENV_EVENTS_FROM = "CALQUE_SESSION_EVENTS_FROM"


class MainProcess:
    """Timers, reclaims and the node guard; the listening socket; the children, restarted when they exit."""

    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self.host = Host.build(config, tally=True)
        self.enforcer = Enforcer(self.host, Cleanup(self.host), NodeGuard(self.host))
        self._stopping = threading.Event()
        self._tcp_fd: int | None = None

    def serve_forever(self) -> None:
        reconcile(self.host)
        raise_descriptor_limit()
        sock = bind_socket(self.config.socket)
        fd = sock.fileno()
        tcp = bind_tcp(self.config.listen_tcp) if self.config.listen_tcp is not None else None
        self._tcp_fd = tcp.fileno() if tcp is not None else None
        roles = ["worker_main"] * self.config.processes
        if self.config.metrics_port is not None or self.config.metrics_textfile is not None:
            roles.append("metrics_main")
        children = [self._spawn(role, fd) for role in roles]
        self.enforcer.start()
        slices = len(self.host.inventory.slices())
        log.info("calque session daemon serving on %s (%d slices)", self.config.socket, slices)
        if self.config.listen_tcp is not None:
            log.info("and on TCP %s:%d", self.config.listen_tcp.address, self.config.listen_tcp.port)
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
            unbind_socket(sock, self.config.socket)
            if tcp is not None:
                tcp.close()
            self.enforcer.stop()
            self.host.close()

    def _spawn(self, entry: str, fd: int) -> subprocess.Popen[bytes]:
        """A child process: a worker serving requests on the inherited socket, or the metrics server."""
        env = {**os.environ, _ENV_CONFIG: self.config.model_dump_json(), _ENV_PARENT: str(os.getpid())}
        assert self.host.tally is not None
        env[_ENV_EVENTS_FROM] = str(self.host.tally.start)  # events count from the daemon's start
        worker = entry == "worker_main"
        fds: tuple[int, ...] = ()
        if worker:
            env[_ENV_FD] = str(fd)
            fds = (fd,)
            if self._tcp_fd is not None:
                env[_ENV_TCP_FD] = str(self._tcp_fd)
                fds = (fd, self._tcp_fd)
        return subprocess.Popen(
            [sys.executable, "-c", f"from calque.session.daemon.daemon_process import {entry}; {entry}()"],
            pass_fds=fds,
            env=env,
        )

    def stop(self) -> None:
        self._stopping.set()


def run_daemon(config: SessionConfig) -> None:
    """Serve until SIGTERM/SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.umask(PRIVATE_UMASK)
    d = MainProcess(config)

    def _stop(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: shutting down", signum)
        d.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    d.serve_forever()


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
    tcp_fd = os.environ.pop(_ENV_TCP_FD, None)
    raise_descriptor_limit()
    host = Host.build(config, events_from=events_from, tally=True)
    cleanup = Cleanup(host)
    listener = Listener(Service(host, cleanup), fd, int(tcp_fd) if tcp_fd is not None else None)
    cleanup.start()
    listener.start()
    _until_told_or_orphaned(threading.Event(), parent)
    listener.drain(5.0)
    host.audit.close()
    os._exit(0)  # worker threads may be mid-request; do not wait for them


def metrics_main() -> None:
    """The metrics process: prometheus_client's one-thread server (bounded backlog, per-connection
    timeout) and/or the textfile, apart from the timers and from the request workers. Both carry
    counts, never who holds what (``daemon_metrics.py``)."""
    from calque import exposition
    from calque.session.daemon.daemon_metrics import collector_registry
    from calque.session.daemon.drains import listed
    from calque.session.daemon.inventory import SliceInventory
    from calque.session.daemon.registry import Registry
    from calque.session.slices import load_reader

    config, parent, events_from = _child_setup()
    registry = Registry(config.db)
    idle = config.idle_policy
    reg = collector_registry(
        SliceInventory(config, load_reader(config)),
        registry.live,
        EventTally(config.audit_log, events_from),
        idle_for=idle.for_ if idle is not None else None,
        drains=lambda: listed(registry),
    )
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


def _textfile_loop(reg: object, path: Path, stop: threading.Event) -> None:
    from calque import exposition

    while True:
        try:
            exposition.write_textfile(reg, path)  # type: ignore[arg-type]
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
