"""The session socket's fair acceptor: no user's connections can starve another user's request.

One thread at a time in each process holds the accept turn: it accepts every connection at once, learns its
uid (SO_PEERCRED) and reads requests without blocking; an idle connection costs a descriptor, never a
thread. A uid may hold ``per_uid`` connections at a time in a process: beyond that a new one is
answered ``refused`` and closed at once. Complete requests wait in one queue per uid and are taken
round robin across uids, so a user with a thousand requests queued delays another user's by at most
one request per thread.

A quick request (one that waits on nothing but the registry: check-out, check-in, status ...) is
served by the turn holder itself, which keeps the turn: no hand-off between threads on its way, and
idle threads are woken for the other requests read with it. A slow one (``adopt`` waits for systemd,
``report`` and ``metrics`` read a lot) goes with the turn: an idle thread takes the turn over and the
holder serves it (leader/follower), so accepting never waits on a slow request. A request that is not
complete within ``timeout`` (or too large, or cut off) gets its error back from the acceptor. The
listening socket is watched with ``EPOLLEXCLUSIVE``: a connection wakes one process's acceptor, not all.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from calque.session.daemon.wire import error, peer_credentials

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
    quick: bool = False  # its request never waits on more than the registry: the turn holder may serve it


Handler = Callable[[Conn, bytes], bytes]


TURN = object()  # what FairQueue.next gives the thread that is to hold the accept turn next

Item = tuple[Conn, bytes]


class FairQueue:
    """Complete requests, taken round robin across uids (one per uid per turn), and the turn: the
    one thread at a time that accepts and reads."""

    def __init__(self) -> None:
        self._per: dict[int, collections.deque[Item]] = {}
        self._turns: collections.deque[int] = collections.deque()
        self._cond = threading.Condition()
        self._size = 0
        self._idle = 0  # threads waiting in next()
        self._turn_free = True
        self._closed = False

    def stash(self, uid: int, item: Item) -> None:
        """Queue ``item`` without waking anyone: the turn holder hands over once its batch is read."""
        with self._cond:
            self._add(uid, item)

    def _add(self, uid: int, item: Item) -> None:
        q = self._per.get(uid)
        if q is None:
            q = self._per[uid] = collections.deque()
            self._turns.append(uid)
        q.append(item)
        self._size += 1

    def _pop(self) -> Item:
        uid = self._turns.popleft()
        q = self._per[uid]
        item = q.popleft()
        self._size -= 1
        if q:
            self._turns.append(uid)  # this uid's next request waits for every other uid's turn
        else:
            del self._per[uid]
        return item

    def close(self) -> None:
        """Stop: every thread waiting in next(), and every later call, gets None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def next(self) -> Item | object | None:
        """For a thread with nothing to do: TURN when the turn is free (it comes first: somebody must
        accept), else the next request, None once closed; waits for one of them."""
        with self._cond:
            self._idle += 1
            try:
                while not self._closed and not self._turn_free and not self._turns:
                    self._cond.wait()
            finally:
                self._idle -= 1
            if self._closed:
                return None
            if self._turn_free:
                self._turn_free = False
                return TURN
            return self._pop()

    def after_batch(self) -> tuple[Item | None, bool]:
        """For the turn holder after a batch: (request to serve, whether it keeps the turn).

        The next request (round robin) when it is quick: the holder serves it and keeps the turn, and
        idle threads are woken for the rest. When it is not, and another thread is idle, the turn goes
        to that thread and the holder serves the request. (None, True): nothing to do, or a slow
        request and every other thread busy (a thread done serving takes it)."""
        with self._cond:
            if self._closed or not self._turns:
                return None, True
            quick = self._per[self._turns[0]][0][0].quick
            if not quick and not self._idle:
                return None, True
            item = self._pop()
            if not quick:
                self._turn_free = True
            wanted = self._size + (0 if quick else 1)  # one per request left, and one for the turn
            if wanted and self._idle:
                self._cond.notify(min(self._idle, wanted))
            return item, quick


class FairAcceptor:
    def __init__(
        self,
        listener: socket.socket,
        handle: Handler,
        *,
        threads: int,
        per_uid: int,
        max_bytes: int,
        timeout: float,
        quick: Callable[[bytes], bool] = lambda line: False,
        identify: Callable[[socket.socket], tuple[int, int, int]] = peer_credentials,
    ) -> None:
        """``identify`` names a connection (pid, uid, gid) for the per-uid bound and the fair queue:
        SO_PEERCRED on the unix socket; on TCP, a key of the client's address (a negative number)."""
        self.listener = listener
        self.handle = handle
        self.quick = quick
        self.identify = identify
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
        self._epoll = select.epoll()
        # ``threads`` serve at once, and one more holds the turn: the holder serves a slow request only
        # when it can pass the turn on, so with every other thread busy a new connection is still accepted.
        self.workers = [
            threading.Thread(target=self._work, name=f"session-worker-{i}", daemon=True) for i in range(threads + 1)
        ]

    def start(self) -> None:
        self.listener.setblocking(False)
        exclusive = getattr(select, "EPOLLEXCLUSIVE", 0)  # Linux 4.5: wake one waiting process, not all
        try:
            self._epoll.register(self.listener.fileno(), select.EPOLLIN | exclusive)
        except OSError:
            self._epoll.register(self.listener.fileno(), select.EPOLLIN)
        for t in self.workers:
            t.start()

    def stop(self) -> None:
        self.stopping = True
        self._queue.close()
        deadline = time.monotonic() + 2.0
        for t in self.workers:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    # -- the turn: accepting and reading ----------------------------------------------------------

    def _take_turn(self) -> Item | None:
        """Accept and read, serving quick requests here, until a slow request is this thread's to
        serve (another thread took the turn); None when stopping."""
        listener = self.listener.fileno()
        while not self.stopping:
            try:
                events = self._epoll.poll(0.1)
            except OSError:
                continue
            for fd, _ in events:
                if fd == listener:
                    self._accept()
                elif (c := self._waiting.get(fd)) is not None:
                    self._read(c)
                elif (refused := self._refused.get(fd)) is not None:
                    self._forget(refused[0])
            self._expire(time.monotonic())
            item, kept = self._queue.after_batch()
            if item is not None:
                if not kept:
                    return item  # another thread holds the turn now
                self._serve(item)
        for c in list(self._waiting.values()):
            self._drop(c)
        for sock, _ in list(self._refused.values()):
            self._forget(sock)
        return None

    def _accept(self) -> None:
        # Every connection waiting (up to ACCEPT_BATCH): their requests are all read before this
        # thread serves one, so the others go to idle threads at once.
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
                pid, uid, gid = self.identify(sock)
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
            # The socket stays blocking: every read and write here passes MSG_DONTWAIT instead (no fcntl).
            c = Conn(sock, pid, uid, gid, time.monotonic() + self.timeout)
            if self._read(c):  # a client sends at once: the request is often here already
                continue
            self._waiting[sock.fileno()] = c
            self._epoll.register(sock.fileno(), select.EPOLLIN)

    def _refuse(self, sock: socket.socket, uid: int) -> None:
        who = f"uid {uid}" if uid >= 0 else "this address"
        msg = f"{who} already has {self.per_uid} connections open to the session daemon; close some and retry"
        try:
            sock.send(error("refused", msg), socket.MSG_DONTWAIT)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self._refused) >= REFUSED_MAX:
            sock.close()
            return
        self._refused[sock.fileno()] = (sock, time.monotonic() + REFUSED_LINGER_S)
        self._epoll.register(sock.fileno(), select.EPOLLIN)

    def _forget(self, sock: socket.socket) -> None:
        """A refused connection whose client has sent (or gone): close it."""
        if self._refused.pop(sock.fileno(), None) is not None:
            with contextlib.suppress(OSError):
                self._epoll.unregister(sock.fileno())
        sock.close()

    def _read(self, c: Conn) -> bool:
        """Read what is there; True when the connection is done with here (queued, failed or gone)."""
        try:
            chunk = c.sock.recv(min(65536, self.max_bytes + 1 - len(c.buf)), socket.MSG_DONTWAIT)
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
        line = bytes(c.buf[:nl])
        c.quick = self.quick(line)
        self._queue.stash(c.uid, (c, line))
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
            c.sock.send(error("protocol", message), socket.MSG_DONTWAIT)
        self._drop(c)

    def _unwatch(self, c: Conn) -> None:
        # Registered with epoll exactly while waiting; most requests are read at accept and never were.
        if self._waiting.pop(c.sock.fileno(), None) is None:
            return
        with contextlib.suppress(OSError):
            self._epoll.unregister(c.sock.fileno())

    def _drop(self, c: Conn) -> None:
        self._unwatch(c)
        self._close(c)

    def _close(self, c: Conn) -> None:
        c.sock.close()
        with self._lock:
            self._open[c.uid] -= 1
            if self._open[c.uid] <= 0:
                del self._open[c.uid]

    # -- the threads: each serves, and holds the turn in its turn -----------------------------------

    def _work(self) -> None:
        while True:
            item = self._queue.next()
            if item is TURN:
                item = self._take_turn()
            if item is None:
                return
            self._serve(cast(Item, item))

    def _serve(self, item: Item) -> None:
        c, line = item
        with self._lock:
            self.in_flight += 1
        try:
            reply = self.handle(c, line)
            with contextlib.suppress(OSError):
                sent = 0
                with contextlib.suppress(BlockingIOError):
                    sent = c.sock.send(reply, socket.MSG_DONTWAIT)  # a reply fits the socket's buffer
                if sent < len(reply):
                    c.sock.settimeout(5)  # a client slow to read gets 5 s for the rest
                    c.sock.sendall(reply[sent:])
        except Exception:
            log.exception("unexpected error serving a connection")
        finally:
            self._close(c)
            with self._lock:
                self.in_flight -= 1
