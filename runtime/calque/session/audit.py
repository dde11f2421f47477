"""The append-only audit trail (JSONL, one fsync'd line per event) and the usage report built from it."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from calque.models.session import UsageReport, UsageRow
from calque.session.registry import Held

END_EVENTS = {"checkin", "expiry", "idle", "release", "vanished"}
# A session's trip (checkout to its end): from a quick test to a week-long reservation.
TRIP_BUCKETS_S = (60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, 259200.0, 604800.0)


FLUSH_EVERY_S = 0.05


class AuditLog:
    """Each event is one ``write`` of one line (O_APPEND: lines never interleave, a kill -9 loses none);
    a flusher thread fsyncs within FLUSH_EVERY_S, so a power loss costs at most that much of the trail
    while the registry itself (SQLite, synchronous=FULL) stays exact."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
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
                os.fsync(self._fd)
            time.sleep(FLUSH_EVERY_S)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._dirty.set()
            os.fsync(self._fd)
            os.close(self._fd)

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
        line = (json.dumps(entry, sort_keys=True) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)
        self._dirty.set()


class EventTally:
    """Lifecycle events counted from the audit trail since the daemon started: exact across every
    process that appends to it (metrics' ``calque_session_events_total``), and the trip time of every
    session that ended (checkout to its end event: ``calque_session_trip_seconds``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._offset = path.stat().st_size
        except FileNotFoundError:
            self._offset = 0
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


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every well-formed line; a torn last line (a crash mid-write) is skipped."""
    out = []
    try:
        with path.open("rb") as f:
            for raw in f:
                try:
                    obj = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(obj, dict) and "event" in obj:
                    out.append(obj)
    except FileNotFoundError:
        return []
    return out


def usage_report(events: list[dict[str, Any]], since: datetime, until: datetime, uid: int | None) -> UsageReport:
    """Slice-hours per (user, profile) overlapping [since, until]; only ``uid``'s rows when given."""
    starts: dict[str, dict[str, Any]] = {}
    ends: dict[str, datetime] = {}
    for e in events:
        sid = e.get("session")
        if not isinstance(sid, str):
            continue
        if e["event"] == "checkout":
            starts[sid] = e
        elif e["event"] in END_EVENTS and sid not in ends:
            ends[sid] = datetime.fromisoformat(e["ts"])
    acc: dict[tuple[int, str, str, str], list[float]] = {}
    for sid, e in starts.items():
        if uid is not None and e["uid"] != uid:
            continue
        begin = datetime.fromisoformat(e["ts"])
        end = ends.get(sid, until)
        lo, hi = max(begin, since), min(end, until)
        if hi <= lo and not (since <= begin <= until):
            continue
        hours = max(0.0, (hi - lo).total_seconds() / 3600)
        key = (e["uid"], e["user"], e["profile"], e["kind"])
        cell = acc.setdefault(key, [0, 0.0])
        cell[0] += 1
        cell[1] += hours
    rows = [
        UsageRow(uid=k[0], user=k[1], profile=k[2], kind=k[3], sessions=int(v[0]), gpu_hours=round(v[1], 4))
        for k, v in sorted(acc.items(), key=lambda kv: (kv[0][1], kv[0][2]))
    ]
    return UsageReport(since=since, until=until, rows=rows)
