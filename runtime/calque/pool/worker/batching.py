"""Deleting summarised claims' messages ten to a DeleteMessageBatch, behind the writers.

A writer hands a SUMMARISED (or DUPLICATE) lease to ``Deleter`` and goes on with the next claim:
nothing waits on a delete once the Summary is written (a lost delete only brings the claim back as
a duplicate, which is deleted without running). The deleter thread takes what has queued while its
last call was in flight, up to ten, and waits up to ``GATHER_S`` for more while the worker has
other claims in hand (a busy worker's deletes go ten to a call; a lone claim's goes at once), then
deletes them in one call. A delete held back that long delays no result: the Summary is written.
"""

from __future__ import annotations

import logging
import queue as queue_mod
import threading
import time
from collections.abc import Callable

from calque.aws.queue import SEND_BATCH, PoolQueue
from calque.errors import CalqueError
from calque.pool.worker.lease import Lease, delete_together

log = logging.getLogger("calque.pool.worker.loop")
GATHER_S = 0.02


class Deleter:
    """Deletes leases' messages in batches; ``ended`` is called for each once its delete is decided."""

    def __init__(self, pool_queue: PoolQueue, ended: Callable[[Lease], None], busy: Callable[[], bool]) -> None:
        self.queue = pool_queue
        self._ended = ended
        self._busy = busy  # the worker holds claims not yet summarised: more deletes are coming
        self._leases: queue_mod.SimpleQueue[Lease | None] = queue_mod.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def put(self, lease: Lease) -> None:
        with self._lock:
            if self._closed:  # a straggler after close: deleted here and now
                self._delete([lease])
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="calque-delete", daemon=True)
                self._thread.start()
            self._leases.put(lease)

    def close(self, timeout_s: float) -> None:
        """Delete what is queued (waiting at most ``timeout_s``), then end the thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._leases.put(None)
        if thread is not None:
            thread.join(timeout=timeout_s)

    def _loop(self) -> None:
        while True:
            first = self._leases.get()
            if first is None:
                return
            batch, ended = [first], False
            until = time.monotonic() + GATHER_S
            while len(batch) < SEND_BATCH:
                try:
                    more = self._leases.get_nowait()
                except queue_mod.Empty:
                    wait = until - time.monotonic()
                    if self._closed or wait <= 0 or not self._busy():
                        break
                    try:
                        more = self._leases.get(timeout=wait)
                    except queue_mod.Empty:
                        break
                if more is None:
                    ended = True
                    break
                batch.append(more)
            self._delete(batch)
            if ended:
                return

    def _call(self, receipts: list[str]) -> dict[str, CalqueError | None]:
        if len(receipts) > 1:
            return self.queue.ack_many(receipts)
        try:
            self.queue.ack(receipts[0])
        except CalqueError as exc:
            return {receipts[0]: exc}
        return {receipts[0]: None}

    def _delete(self, batch: list[Lease]) -> None:
        try:
            outcomes: list[bool | CalqueError] = delete_together(batch, self._call)
        except Exception as exc:  # a bug must not end the thread: the claims come back as duplicates
            log.exception("deleting %d message(s) failed", len(batch))
            outcomes = [CalqueError(str(exc))] * len(batch)
        for lease, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, CalqueError):
                log.warning("could not delete message %s: %s (it will be redelivered)", lease.message_id, outcome)
            self._ended(lease)
