"""This instance's usage records, written as things happen by its own components (the contract and why:
``models/instance_usage.py``): the warm-up at every boot (from the kernel's boot time), each worker
from its start with a heartbeat, the drain on the termination hook (``end: terminated``) and a warm-up
that leaves the instance to stop in the warm pool (``end: stopped``).

A write that fails is logged and retried at the next heartbeat, never fatal: serving claims matters
more than the ledger, and the group's activity history (``ledger/instance_records.py``) flags an
instance the records missed. A wall clock that jumps past ``RECORD_LIVE_S`` between two heartbeats
(a hibernated instance resumed) closes the stretch at its last heartbeat and starts a new one, so time
asleep is never counted.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from calque.aws.aws_errors import AWS_ERRORS
from calque.aws.store import RunStore
from calque.models.instance_usage import (
    RECORD_HEARTBEAT_S,
    RECORD_LIVE_S,
    InstanceEnd,
    InstanceRecord,
    record_uri,
)
from calque.pool.worker.instance import InstanceGuard
from calque.timefmt import utc_moment

log = logging.getLogger("calque.pool.usage")
PROC_ENV = "CALQUE_PROC"  # where /proc is (the kernel's boot time); tests point it at a stand-in


def boot_time() -> float | None:
    """When this machine booted (``btime`` of ``/proc/stat``): when EC2 began billing this boot."""
    try:
        for line in (Path(os.environ.get(PROC_ENV) or "/proc") / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class InstanceUsage:
    """One component's record of its instance's time up; ``beat()`` refreshes it, ``finish()`` ends it."""

    def __init__(
        self,
        store: RunStore,
        pool: str,
        instance_id: str,
        instance_type: str,
        writer: str,
        started_at: float | None = None,
        lifecycle_state: str | None = None,
    ) -> None:
        self.store = store
        now = time.time()
        self.record = InstanceRecord(
            pool=pool,
            instance_id=instance_id,
            instance_type=instance_type,
            writer=writer,
            started_at=utc_moment(started_at if started_at is not None else now),
            seen_at=utc_moment(now),
            lifecycle_state=lifecycle_state,
        )
        self.busy = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _put(self) -> None:
        r = self.record
        try:
            self.store.put(record_uri(self.store, r.instance_id, r.started_at, r.writer), r.model_dump_json().encode())
        except AWS_ERRORS as exc:
            log.warning(
                "cannot write the usage record of %s (%s); trying again at the next heartbeat", r.instance_id, exc
            )

    def beat(self) -> None:
        """The instance is up now: refresh the record (a new stretch after a jump of the wall clock)."""
        now = time.time()
        with self._lock:
            r = self.record
            if now - r.seen_at.timestamp() > RECORD_LIVE_S:  # asleep (hibernated) since: that stretch is over
                log.info(
                    "%s: no heartbeat for %.0f s; starting a new usage stretch",
                    r.instance_id,
                    now - r.seen_at.timestamp(),
                )
                self._put()
                r = r.model_copy(update={"started_at": utc_moment(now)})
            self.record = r.model_copy(update={"seen_at": utc_moment(now), "busy": self.busy})
            self._put()

    def start(self, every_s: float = RECORD_HEARTBEAT_S) -> InstanceUsage:
        """Write the record now and refresh it every ``every_s`` in a thread until ``finish()``."""
        self.beat()

        def loop() -> None:
            while not self._stop.wait(every_s):
                self.beat()

        self._thread = threading.Thread(target=loop, name="calque-usage-record", daemon=True)
        self._thread.start()
        return self

    def finish(self, end: InstanceEnd | None = None) -> None:
        """The writer stops: a last heartbeat, and the instance's end where it is known (``end``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        now = time.time()
        with self._lock:
            update: dict[str, object] = {"seen_at": utc_moment(now), "busy": self.busy}
            if end is not None:
                update.update(ended_at=utc_moment(now), end=end)
            self.record = self.record.model_copy(update=update)
            self._put()


class RecordedInstance:
    """An instance guard that keeps the worker's usage record: busy once it holds a claim, and its end
    written before the last worker out completes the termination hook (after which the instance goes)."""

    def __init__(self, guard: InstanceGuard, usage: InstanceUsage) -> None:
        self.guard = guard
        self.usage = usage

    def register(self, worker_id: str) -> None:
        self.guard.register(worker_id)

    def holding(self, worker_id: str, held: Callable[[], bool]) -> None:
        if held():
            self.usage.busy = True
        self.guard.holding(worker_id, held)

    def terminating(self) -> bool:
        return self.guard.terminating()

    def held(self) -> bool:
        return self.guard.held()

    def leave(self, worker_id: str, *, drained: bool) -> None:
        self.usage.finish("terminated" if drained else None)
        self.guard.leave(worker_id, drained=drained)
