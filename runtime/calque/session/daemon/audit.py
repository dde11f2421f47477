"""The append-only audit trail: JSONL, one fsync'd line per event, in a root-only log directory.

It is a record for people (and logrotate), not the data usage reports are built from: those read the
registry's usage table (``usage.py``), so nothing written to or planted in a log can bill anyone.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from calque.session.daemon.rows import Held
from calque.session.files import check_directory, open_private, private_directory

END_EVENTS = {"checkin", "expiry", "idle", "release", "vanished", "drained"}
# A session's trip (checkout to its end): from a quick test to a week-long reservation.
TRIP_BUCKETS_S = (60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, 259200.0, 604800.0)


FLUSH_EVERY_S = 0.05


class AuditLog:
    """Each event is one ``write`` of one line (O_APPEND: lines never interleave, a kill -9 loses none);
    a flusher thread fsyncs within FLUSH_EVERY_S, so a power loss costs at most that much of the trail
    while the registry itself (SQLite, synchronous=FULL) stays exact."""

    def __init__(self, path: Path) -> None:
        private_directory(path.parent, "audit log directory", mode=0o750)
        self.path = path
        self._lock = threading.Lock()
        self._fd = self._open()
        self._id = self._file_id(self._fd)
        self._dirty = threading.Event()
        self._closed = False
        self._flusher = threading.Thread(target=self._flush_loop, name="audit-fsync", daemon=True)
        self._flusher.start()

    def _flush_loop(self) -> None:
        while True:
            self._dirty.wait()
            if self._closed:
                return
            self._dirty.clear()
            with self._lock:
                fd = self._fd
            # Outside the lock: a request writing its line never waits for the disk. A rotation in
            # between fsyncs the old file itself before closing it, so EBADF here loses nothing.
            with contextlib.suppress(OSError):
                os.fsync(fd)
            time.sleep(FLUSH_EVERY_S)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._dirty.set()
            os.fsync(self._fd)
            os.close(self._fd)

    def _open(self) -> int:
        # Root's own, regular, one link, never through a symlink: a planted log is refused, not used.
        return open_private(self.path, os.O_WRONLY | os.O_APPEND, "audit log", tighten=False)

    def _follow_rotation(self) -> None:
        """After logrotate moved the file away, write to a new one at the path (no signal needed; each
        worker process notices on its own next event). Called with ``_lock`` held."""
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_ino, now.st_dev) == self._id:
            return
        check_directory(self.path.parent, "audit log directory")
        fd = self._open()
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd, self._id = fd, self._file_id(fd)

    @staticmethod
    def _file_id(fd: int) -> tuple[int, int]:
        st = os.fstat(fd)
        return st.st_ino, st.st_dev

    def event(self, event: str, **fields: Any) -> None:
        """An event about no session (a refused request from another host)."""
        entry: dict[str, Any] = {"ts": datetime.now(timezone.utc).isoformat(), "event": event, **fields}
        self._write(entry)

    def record(self, event: str, held: Held, *, by_uid: int | None = None, reason: str = "", **extra: Any) -> None:
        s = held.session
        entry: dict[str, Any] = {
            "ts": datetime.now(timezone.utc).isoformat(),
            "event": event,
            "session": s.id,
            "uid": s.uid,
            "user": s.user,
            "slice": s.slice_id,
            "kind": s.kind,
            "profile": s.profile,
            "gpu": s.gpu_index,
            "created_at": s.created_at.isoformat(),
            "expires_at": s.expires_at.isoformat(),
            "by_uid": s.uid if by_uid is None else by_uid,
            "reason": reason,
        }
        entry.update(extra)
        self._write(entry)

    def _write(self, entry: dict[str, Any]) -> None:
        line = (json.dumps(entry, sort_keys=True) + "\n").encode()
        with self._lock:
            self._follow_rotation()
            os.write(self._fd, line)
        self._dirty.set()


class EventTally:
    """Lifecycle events counted from the audit trail since the daemon started: exact across every
    process that appends to it (metrics' ``calque_session_events_total``), and the trip time of every
    session that ended (checkout to its end event: ``calque_session_trip_seconds``)."""

    def __init__(self, path: Path, start: int | None = None) -> None:
        """Counts the lines after byte ``start`` (default: the file's end now). The daemon's worker and
        metrics processes get the main process's start, so each counts from the daemon's start, not
        from its own (a checkout served before the metrics process was up counts too)."""
        self.path = path
        if start is None:
            try:
                start = path.stat().st_size
            except FileNotFoundError:
                start = 0
        self.start = start
        self._offset = start
        self._counts: dict[str, int] = {}
        self._trip_buckets = [0] * len(TRIP_BUCKETS_S)  # sessions that lasted at most each bound
        self._trip_count = 0
        self._trip_sum = 0.0
        self._lock = threading.Lock()

    def trips(self) -> tuple[list[tuple[float, int]], int, float]:
        """Ended sessions' trip times: cumulative (bound, count) buckets, the count and the sum of seconds."""
        self.counts()
        with self._lock:
            return list(zip(TRIP_BUCKETS_S, self._trip_buckets, strict=True)), self._trip_count, self._trip_sum

    def counts(self) -> dict[str, int]:
        with self._lock:
            try:
                with self.path.open("rb") as f:
                    if os.fstat(f.fileno()).st_size < self._offset:
                        self._offset = 0  # rotated: a new file, counted from its start
                    f.seek(self._offset)
                    data = f.read()
            except FileNotFoundError:
                return dict(self._counts)
            end = data.rfind(b"\n") + 1  # only whole lines; a line being written is counted next time
            for raw in data[:end].splitlines():
                try:
                    entry = json.loads(raw)
                    event = entry.get("event")
                except (ValueError, AttributeError):
                    continue
                if isinstance(event, str):
                    self._counts[event] = self._counts.get(event, 0) + 1
                if event in END_EVENTS:
                    self._trip(entry)
            self._offset += end
            return dict(self._counts)

    def _trip(self, entry: dict[str, Any]) -> None:
        try:
            ended, began = datetime.fromisoformat(entry["ts"]), datetime.fromisoformat(entry["created_at"])
        except (KeyError, TypeError, ValueError):
            return
        seconds = max((ended - began).total_seconds(), 0.0)
        self._trip_count += 1
        self._trip_sum += seconds
        for i, bound in enumerate(TRIP_BUCKETS_S):
            if seconds <= bound:
                self._trip_buckets[i] += 1
