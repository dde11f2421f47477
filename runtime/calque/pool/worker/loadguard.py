"""The worker's side of load records: say how loading went, where submitters look, and back off on failure.

``LoadGuard.loading()`` wraps everything a worker does before it serves (fetching the workload,
importing it, ``@enter``). When that raises, the guard writes a failed ``LoadRecord`` (error,
traceback, worker id, time, how many times in a row this slot failed), holds for a backoff that
grows with that count (``hold_s``: 0, 10, 20, 40 ... 300 s; SIGTERM/SIGINT end the hold) and
raises ``WorkerLoadError`` (exit code 3, infrastructure). systemd restarts the worker after its
``RestartSec`` either way, so a worker whose script is broken retries ever more slowly on any
systemd version, and one whose script was fixed loads at its next restart. When loading works,
``serving`` writes the class's methods and refreshes the record every ``HEARTBEAT_S``; ``stopped``
marks it when the worker exits.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import traceback
from collections.abc import Iterator
from datetime import datetime, timezone

from calque.aws.store import RunStore
from calque.errors import CalqueError, InfrastructureError
from calque.models import LoadRecord
from calque.models.pool_loads import FRESH_S, HEARTBEAT_S, slot_uri
from calque.warm import WarmSupervisor

log = logging.getLogger("calque.pool")

BACKOFF_FIRST_S = 10.0
BACKOFF_MAX_S = 300.0


def hold_s(failures: int) -> float:
    """How long a worker whose load failed ``failures`` times in a row waits before it exits."""
    if failures <= 1:
        return 0.0
    return min(BACKOFF_FIRST_S * 2.0 ** (failures - 2), BACKOFF_MAX_S)


class WorkerLoadError(InfrastructureError):
    """The worker could not load its workload; its load record says why (exit code 3, not 2: usage)."""


def _hold(seconds: float) -> None:
    """Sleep ``seconds``, or less when SIGTERM/SIGINT arrives (systemctl stop must not wait out a backoff)."""
    if seconds <= 0:
        return
    done = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        done.wait(seconds)
        return
    old = {s: signal.signal(s, lambda *_: done.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        done.wait(seconds)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


class LoadGuard:
    """One worker process's load record (slot ``slot``) in the pool's ``store``."""

    def __init__(self, store: RunStore, workload: str, slot: str, worker_id: str) -> None:
        self.store, self.workload, self.slot, self.worker_id = store, workload, slot, worker_id
        self.uri = slot_uri(store, slot)
        self._record: LoadRecord | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _put(self, record: LoadRecord) -> None:
        self._record = record
        try:
            self.store.put(self.uri, record.model_dump_json().encode())
        except CalqueError as exc:  # the record helps submitters; the worker's own job goes on without it
            log.warning("cannot write the load record %s: %s", self.uri, exc)

    def _previous_failures(self, now: datetime) -> int:
        with contextlib.suppress(CalqueError, ValueError):
            data = self.store.get(self.uri)
            if data is not None:
                prev = LoadRecord.model_validate_json(data)
                if prev.state == "failed" and (now - prev.at).total_seconds() <= FRESH_S:
                    return prev.failures
        return 0

    @contextlib.contextmanager
    def loading(self) -> Iterator[None]:
        """Run the load; on an error, record it, back off, and raise ``WorkerLoadError`` from it."""
        try:
            yield
        except Exception as exc:
            now = datetime.now(timezone.utc)
            failures = self._previous_failures(now) + 1
            wait = hold_s(failures)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            error = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
            record = LoadRecord(
                slot=self.slot, worker_id=self.worker_id, state="failed", workload=self.workload, error=error,
                traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                failures=failures, retry_in_s=wait, at=now, seen_at=now,
            )  # fmt: skip
            self._put(record)
            log.error("load failed (%d in a row): %s; recorded in %s", failures, error, self.uri)
            if wait:
                log.error("holding %gs before exiting (backoff), then the service manager restarts this worker", wait)
                _hold(wait)
            raise WorkerLoadError(
                f"the worker could not load {self.workload}: {error} (recorded in {self.uri})"
            ) from exc

    def serving(self, sup: WarmSupervisor) -> None:
        """Record the loaded class's methods, then refresh the record every ``HEARTBEAT_S`` until ``stopped``."""
        now = datetime.now(timezone.utc)
        self._put(
            LoadRecord(
                slot=self.slot, worker_id=self.worker_id, state="serving", workload=self.workload,
                workload_digest=sup.digest, methods=sup.methods, default_method=sup.default_method(),
                enter_seconds=round(sup.enter_seconds, 6), at=now, seen_at=now,
            )
        )  # fmt: skip
        self._thread = threading.Thread(target=self._refresh, name="calque-load-record", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            if self._record is not None:
                self._put(self._record.model_copy(update={"seen_at": datetime.now(timezone.utc)}))

    def stopped(self) -> None:
        """Mark the record stopped (a stopped worker serves nothing; its methods are no promise)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._record is not None and self._record.state == "serving":
            now = datetime.now(timezone.utc)
            self._put(self._record.model_copy(update={"state": "stopped", "seen_at": now}))
