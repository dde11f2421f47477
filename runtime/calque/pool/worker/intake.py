"""The claimer's receiving: claims received ahead of the runner, a batch per receive, prepared concurrently.

A receive, then a Summary-exists check and a manifest read per claim, are three round trips (about
20 ms each against moto, 10-30 ms on SQS and S3) before a claim can run. One claim at a time, that
bounds a worker to a claim per round trip whatever its method costs. So the receiver asks SQS for
as many messages as the runner drains in one such round trip (``Ahead``: the round trip over the
time a claim drains, 1 to 10) and prepares them on a few threads at once.

The depth is what keeps several workers fair: a claim received ahead waits in this worker for about
one round trip before it runs, never longer than it would have waited on the queue. A pool whose
claims take seconds holds one claim ahead, as it always did (the depth starts at 1 and grows only
once claims are seen to drain faster than the round trip).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import queue as queue_mod
import threading
import time
from collections import deque
from collections.abc import Callable

from calque.aws.queue import PoolQueue
from calque.errors import CalqueError
from calque.pool.worker.lease import Lease, Role, State

log = logging.getLogger("calque.pool.worker.loop")
MAX_AHEAD = 10  # SQS's MaxNumberOfMessages
PREPARERS = 4  # claims prepared at once (each: one HEAD, one GET)
PAUSE_S = 5.0  # how often a worker of a held pool looks again
_WEIGHT = 0.3  # of a new claim's drain time in its moving average
_WINDOW = 8  # round trips remembered


class Ahead:
    """How many claims to hold ready: the receive-and-prepare round trip over a claim's drain time.

    The round trip is the shortest of the last few seen: a receive that waited on an empty queue
    (long polling until a claim arrived) says nothing about the round trip and must not deepen it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fetch_s: deque[float] = deque(maxlen=_WINDOW)
        self._drain_s: float | None = None

    def fetched(self, seconds: float) -> None:
        """One receive and the preparation of what it brought took ``seconds``."""
        with self._lock:
            self._fetch_s.append(seconds)

    def drained(self, seconds: float) -> None:
        """The runner spent ``seconds`` on one claim."""
        with self._lock:
            old = self._drain_s
            self._drain_s = seconds if old is None else old + _WEIGHT * (seconds - old)

    def depth(self) -> int:
        with self._lock:
            if not self._fetch_s or self._drain_s is None:
                return 1
            return max(1, min(MAX_AHEAD, math.ceil(min(self._fetch_s) / max(self._drain_s, 1e-4))))


class Receiver:
    """Receives claims for the runner; ``hold`` makes each a held lease, ``prepare`` is the claimer's check."""

    def __init__(
        self,
        pool_queue: PoolQueue,
        *,
        hold: Callable[[Lease], None],
        prepare: Callable[[Lease], None],
        stop: threading.Event,
        wait_s: int,
        paused: Callable[[], bool] = lambda: False,
    ) -> None:
        self.queue = pool_queue
        self._hold = hold
        self._prepare = prepare
        self._stop = stop
        self.wait_s = wait_s
        self._paused = paused  # the lab's budget holds the pool: no new claim is taken
        self.ahead = Ahead()
        self.ready: queue_mod.Queue[Lease] = queue_mod.Queue(maxsize=MAX_AHEAD)

    def receive(self, wait_s: int, max_messages: int = 1) -> list[Lease]:
        """Up to ``max_messages`` held leases (none after a failed receive, which waits a second, and none
        while the pool is held for its lab's budget, which waits ``PAUSE_S``)."""
        if self._paused():
            self._stop.wait(PAUSE_S)
            return []
        try:
            msgs = self.queue.receive(wait_s, max_messages)
        except CalqueError as exc:
            log.warning("receive failed: %s; retrying in 1s", exc)
            self._stop.wait(1.0)
            return []
        leases = []
        for m in msgs:
            attrs = m.get("Attributes", {})
            lease = Lease(
                message_id=m["MessageId"],
                receipt=m["ReceiptHandle"],
                body=m.get("Body", ""),
                receive_count=int(attrs.get("ApproximateReceiveCount", 1)),
            )
            self._hold(lease)
            leases.append(lease)
        return leases

    def prepare(self, lease: Lease) -> None:
        """The claimer's check; a bug in it lets the claim go (it comes back after the VT), never the thread."""
        try:
            self._prepare(lease)
        except Exception:
            log.exception("preparing the claim of message %s failed: it will be redelivered", lease.message_id)
            lease.advance_unless_taken(State.ABANDONED, Role.CLAIMER)

    def loop(self) -> None:
        """The receiver thread (``prefetch``): keep ``ready`` filled to the current depth until stopped."""
        with cf.ThreadPoolExecutor(max_workers=PREPARERS, thread_name_prefix="calque-prepare") as pool:
            while not self._stop.is_set():
                room = self.ahead.depth() - self.ready.qsize()
                if room <= 0:
                    self._stop.wait(0.005)
                    continue
                t0 = time.monotonic()
                leases = self.receive(self.wait_s, room)
                if not leases:
                    continue
                if self._stop.is_set():  # stopping: the stopper releases them, unprepared, from ``ready``
                    for lease in leases:
                        self.ready.put(lease)
                    continue
                futures = [pool.submit(self.prepare, lease) for lease in leases]
                for lease, fut in zip(leases, futures, strict=True):
                    fut.result()
                    self.ready.put(lease)  # in the order SQS gave them, each as soon as it is prepared
                self.ahead.fetched(time.monotonic() - t0)
