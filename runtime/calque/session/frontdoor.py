"""The session socket's front door: no user's connections can starve another user's request.

One thread per process accepts every connection at once, learns its uid (SO_PEERCRED) and reads
requests without blocking; an idle connection costs a descriptor, never a worker. A uid may hold
``per_uid`` connections at a time in a process: beyond that a new one is answered ``refused`` and
closed at once. Complete requests wait in one queue per uid, and the worker threads take them round
robin across uids, so a user with a thousand requests queued delays another user's by at most one
request per worker. A request that is not complete within ``timeout`` (or too large, or cut off)
gets its error back from this thread, as before.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from calque.session.protocol import error, peer_credentials

log = logging.getLogger("calque.session")

ACCEPT_BATCH = 64  # connections taken per wake-up before looking at the others again
# A refused connection is kept (write side shut) until its client has sent its request or for
# REFUSED_LINGER_S, so the client reads the refusal instead of a broken pipe; at most REFUSED_MAX.
REFUSED_LINGER_S = 1.0
REFUSED_MAX = 1024


@dataclass
class Conn:
    sock: socket.socket
    pid: int
    uid: int
    gid: int
    deadline: float
    buf: bytearray = field(default_factory=bytearray)


Handler = Callable[[Conn, bytes], bytes]


class FairQueue:
    """Complete requests, taken round robin across uids (one per uid per turn)."""

    def __init__(self) -> None:
        self._per: dict[int, collections.deque[tuple[Conn, bytes] | None]] = {}
        self._turns: collections.deque[int] = collections.deque()
        self._cond = threading.Condition()

    def put(self, uid: int, item: tuple[Conn, bytes] | None) -> None:
        with self._cond:
            q = self._per.get(uid)
            if q is None:
                q = self._per[uid] = collections.deque()
                self._turns.append(uid)
            q.append(item)
            self._cond.notify()

    def get(self) -> tuple[Conn, bytes] | None:
        with self._cond:
            while not self._turns:
                self._cond.wait()
            uid = self._turns.popleft()
            q = self._per[uid]
            item = q.popleft()
            if q:
                self._turns.append(uid)  # this uid's next request waits for every other uid's turn
            else:
                del self._per[uid]
            return item


class FrontDoor:
    def __init__(
        self,
        listener: socket.socket,
        handle: Handler,
        *,
        threads: int,
        per_uid: int,
        max_bytes: int,
        timeout: float,
    ) -> None:
        self.listener = listener
        self.handle = handle
        self.per_uid = per_uid
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.stopping = False
        self.in_flight = 0
        self._open: collections.Counter[int] = collections.Counter()  # connections held per uid
        self._lock = threading.Lock()
        self._queue = FairQueue()
        self._waiting: collections.OrderedDict[int, Conn] = collections.OrderedDict()  # by deadline (fd order)
        self._refused: collections.OrderedDict[int, tuple[socket.socket, float]] = collections.OrderedDict()
        self._sel = selectors.DefaultSelector()
        self._loop = threading.Thread(target=self._run, name="session-frontdoor", daemon=True)
        self.workers = [
            threading.Thread(target=self._work, name=f"session-worker-{i}", daemon=True) for i in range(threads)
        ]

    def start(self) -> None:
        self.listener.setblocking(False)
        self._sel.register(self.listener, selectors.EVENT_READ, None)
        self._loop.start()
        for t in self.workers:
            t.start()

    def stop(self) -> None:
        self.stopping = True
        for _ in self.workers:
            self._queue.put(-1, None)
        self._loop.join(timeout=2)

    # -- the accepting and reading thread ---------------------------------------------------------

    def _run(self) -> None:
        while not self.stopping:
            try:
                events = self._sel.select(0.1)
            except OSError:
                continue
            for key, _ in events:
                if key.data is None:
                    self._accept()
                elif isinstance(key.data, Conn):
                    self._read(key.data)
                else:
                    self._forget(key.data)
            self._expire(time.monotonic())
        for c in list(self._waiting.values()):
            self._drop(c)
        for sock, _ in list(self._refused.values()):
            self._forget(sock)

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    log.error("out of descriptors accepting a session connection; the rest wait in the backlog")
                    time.sleep(0.05)  # the socket stays readable: do not spin until a descriptor frees
                return
            try:
                pid, uid, gid = peer_credentials(sock)
            except OSError:
                sock.close()
                continue
            with self._lock:
                crowded = self._open[uid] >= self.per_uid
                if not crowded:
                    self._open[uid] += 1
            if crowded:
                self._refuse(sock, uid)
                continue
            sock.setblocking(False)
            c = Conn(sock, pid, uid, gid, time.monotonic() + self.timeout)
            if self._read(c):  # a client sends at once: the request is often here already
                continue
            self._waiting[sock.fileno()] = c
            self._sel.register(sock, selectors.EVENT_READ, c)

    def _refuse(self, sock: socket.socket, uid: int) -> None:
        msg = f"uid {uid} already has {self.per_uid} connections open to the session daemon; close some and retry"
        try:
            sock.setblocking(False)
            sock.send(error("refused", msg))
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self._refused) >= REFUSED_MAX:
            sock.close()
            return
        self._refused[sock.fileno()] = (sock, time.monotonic() + REFUSED_LINGER_S)
        self._sel.register(sock, selectors.EVENT_READ, sock)

    def _forget(self, sock: socket.socket) -> None:
        """A refused connection whose client has sent (or gone): close it."""
        self._refused.pop(sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(sock)
        sock.close()

    def _read(self, c: Conn) -> bool:
        """Read what is there; True when the connection is done with here (queued, failed or gone)."""
        try:
            chunk = c.sock.recv(min(65536, self.max_bytes + 1 - len(c.buf)))
        except BlockingIOError:
            return False
        except OSError:
            self._drop(c)
            return True
        if not chunk:
            self._fail(c, "connection closed before a complete request (no newline)")
            return True
        c.buf += chunk
        nl = c.buf.find(b"\n")
        if nl > self.max_bytes or (nl < 0 and len(c.buf) > self.max_bytes):
            self._fail(c, f"request larger than {self.max_bytes} bytes")
            return True
        if nl < 0:
            return False
        self._unwatch(c)
        self._queue.put(c.uid, (c, bytes(c.buf[:nl])))
        return True

    def _expire(self, now: float) -> None:
        while self._refused:
            sock, until = next(iter(self._refused.values()))
            if until > now:
                break
            self._forget(sock)
        while self._waiting:
            c = next(iter(self._waiting.values()))
            if c.deadline > now:
                return
            self._fail(c, f"request not complete within {self.timeout:g} s")

    def _fail(self, c: Conn, message: str) -> None:
        with contextlib.suppress(OSError):
            c.sock.send(error("protocol", message))
        self._drop(c)

    def _unwatch(self, c: Conn) -> None:
        # Registered with the selector exactly while waiting; most requests are read at accept and
        # never were (unregistering those would cost a KeyError each).
        if self._waiting.pop(c.sock.fileno(), None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(c.sock)

    def _drop(self, c: Conn) -> None:
        self._unwatch(c)
        self._close(c)

    def _close(self, c: Conn) -> None:
        c.sock.close()
        with self._lock:
            self._open[c.uid] -= 1
            if self._open[c.uid] <= 0:
                del self._open[c.uid]

    # -- the worker threads -----------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            c, line = item
            with self._lock:
                self.in_flight += 1
            try:
                reply = self.handle(c, line)
                c.sock.setblocking(True)
                c.sock.settimeout(5)
                with contextlib.suppress(OSError):
                    c.sock.sendall(reply)
            except Exception:
                log.exception("unexpected error serving a connection")
            finally:
                self._close(c)
                with self._lock:
                    self.in_flight -= 1
