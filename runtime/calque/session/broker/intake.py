"""Connections whose request is not read yet, all on one thread: a selector reads each until its one
JSON line is whole, then hands the line on (``BrokerServer`` identifies the caller and applies the
per-user limits). Nobody is known before the request is read, so nothing here counts per user:

- each connection has one deadline for its whole request (``request_timeout`` from its accept), not
  one per ``recv``, so a client sending a byte a second is closed after it like an idle one;
- unread connections share one small budget (``max_unread``), and one source (a TCP peer's address,
  a unix caller's uid) may hold at most ``max_unread_per_source`` of it. A source over its part closes
  its own oldest unread connection (once that one is older than ``FRESH_S``: a burst of fresh ones
  may borrow from the shared budget), and a full budget the largest source's oldest, never the new
  one: 200 idle connections from a login host cost their owner its own oldest, and another user on
  that host, whose request comes at once, is read.

Whoever is closed here reads a sentence first (one answer line, unsealed: it grants nothing), and the
socket is drained before it closes, so the client sees the sentence, not a reset.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("calque.broker")

FRESH_S = 0.5  # a connection this young is never closed for its source's part (only for the whole budget)


@dataclass(eq=False)
class Unread:
    """One accepted connection, reading its request; ``context`` is the server's (how to identify it)."""

    conn: socket.socket
    source: str
    deadline: float  # monotonic: its whole request by then
    context: Any
    buf: bytearray = field(default_factory=bytearray)


Refusal = Callable[[str], bytes]  # a sentence -> the answer line a refused client reads
OnLine = Callable[[Unread, bytes], None]  # a whole request line: the connection is the callee's now


class Intake:
    def __init__(
        self,
        *,
        deadline_s: float,
        max_bytes: int,
        max_unread: int,
        max_unread_per_source: int,
        refusal: Refusal,
        on_line: OnLine,
    ) -> None:
        self.deadline_s = deadline_s
        self.max_bytes = max_bytes
        self.max_unread = max_unread
        self.max_unread_per_source = min(max_unread_per_source, max_unread)
        self.refusal = refusal
        self.on_line = on_line
        self._selector = selectors.DefaultSelector()
        self._incoming: collections.deque[Unread] = collections.deque()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        # oldest first, per source: who is closed when a source (or the whole budget) is full
        self._by_source: dict[str, collections.OrderedDict[int, Unread]] = {}
        self._count = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-intake", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake()
        if self._thread.ident is not None:  # started (a broker that never bound a socket has none)
            self._thread.join(timeout=5)

    def add(self, conn: socket.socket, source: str, context: Any) -> None:
        """A connection just accepted (any thread): read on the intake's thread from now on."""
        conn.setblocking(False)
        with self._lock:
            self._incoming.append(Unread(conn, source, time.monotonic() + self.deadline_s, context))
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe already wakes it
            os.write(self._wake_w, b"x")

    # -- the thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    self._turn()
                except Exception:
                    log.exception("the broker's intake failed a turn; it goes on")
        finally:
            for per in list(self._by_source.values()):
                for u in list(per.values()):
                    self._drop(u)
            self._selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _turn(self) -> None:
        soonest = min((u.deadline for per in self._by_source.values() for u in per.values()), default=None)
        wait = 0.5 if soonest is None else max(0.0, min(0.5, soonest - time.monotonic()))
        for key, _ in self._selector.select(wait):
            if key.data is None:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 4096)
            else:
                self._read(key.data)
        with self._lock:
            incoming, self._incoming = self._incoming, collections.deque()
        for u in incoming:
            self._admit(u)
        now = time.monotonic()
        for per in list(self._by_source.values()):
            for u in [u for u in per.values() if u.deadline <= now]:
                self._refuse(u, f"no complete request (one JSON line) within {self.deadline_s:g} s of connecting")

    def _admit(self, u: Unread) -> None:
        per = self._by_source.get(u.source)
        oldest = next(iter(per.values())) if per else None
        if per is not None and oldest is not None and len(per) >= self.max_unread_per_source and self._stale(oldest):
            self._refuse(oldest, self._crowded(u.source))
        elif self._count >= self.max_unread:
            largest = max(self._by_source, key=lambda s: len(self._by_source[s]))
            self._refuse(next(iter(self._by_source[largest].values())), self._crowded(largest))
        self._by_source.setdefault(u.source, collections.OrderedDict())[id(u)] = u
        self._count += 1
        try:
            self._selector.register(u.conn, selectors.EVENT_READ, u)
        except (OSError, ValueError):
            self._drop(u)
            return
        self._read(u)  # a client sends its request as it connects: read now, before anything newer can crowd it

    def _stale(self, u: Unread) -> bool:
        """Unread for longer than an honest client takes to send: a burst of one user's fresh
        connections may go past its source's part (up to the shared budget), an idle crowd may not."""
        return time.monotonic() - (u.deadline - self.deadline_s) >= min(FRESH_S, self.deadline_s / 2)

    def _crowded(self, source: str) -> str:
        return (
            f"closed unanswered: {source} holds the most connections that sent no request "
            f"(the broker reads at most {self.max_unread_per_source} per source, {self.max_unread} in all); "
            "send the request as soon as you connect"
        )

    def _read(self, u: Unread) -> None:
        try:
            chunk = u.conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client went away before its request was whole
            self._drop(u)
            return
        u.buf += chunk
        end = u.buf.find(b"\n")
        if end < 0 or end > self.max_bytes:
            if len(u.buf) > self.max_bytes:
                self._refuse(u, f"a request is one JSON line of at most {self.max_bytes} bytes")
            return
        self._forget(u)
        u.conn.setblocking(True)
        self.on_line(u, bytes(u.buf[:end]))

    def _refuse(self, u: Unread, sentence: str) -> None:
        log.info("closed a connection from %s: %s", u.source, sentence)
        with contextlib.suppress(OSError):
            u.conn.send(self.refusal(sentence), socket.MSG_DONTWAIT)
            u.conn.shutdown(socket.SHUT_WR)
        self._drop(u)

    def _drop(self, u: Unread) -> None:
        self._forget(u)
        with contextlib.suppress(OSError):  # what it sent and nobody read would turn the close into a reset
            for _ in range(16):
                if not u.conn.recv(65536, socket.MSG_DONTWAIT):
                    break
        u.conn.close()

    def _forget(self, u: Unread) -> None:
        per = self._by_source.get(u.source)
        if per is None or per.pop(id(u), None) is None:
            return
        self._count -= 1
        if not per:
            del self._by_source[u.source]
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(u.conn)
