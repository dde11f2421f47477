"""The session registry: SQLite in WAL mode with synchronous=FULL, one transaction per change.

A partial unique index (one live session per slice) makes a double assignment impossible even if
the code above it were wrong; ``BEGIN IMMEDIATE`` serialises writers across threads and processes.
A commit happens before any answer goes out, so a client that was told "granted" survives a
``kill -9`` of the daemon.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from calque.models.session import EndReason, Session, Slice

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions(
  id TEXT PRIMARY KEY,
  slice_id TEXT NOT NULL,
  uid INTEGER NOT NULL,
  gid INTEGER NOT NULL,
  user TEXT NOT NULL,
  request_id TEXT,
  created_at REAL NOT NULL,
  expires_at REAL NOT NULL,
  notice_sent INTEGER NOT NULL DEFAULT 0,
  ended_at REAL,
  end_reason TEXT,
  last_active REAL NOT NULL,
  slice_json TEXT NOT NULL,
  env_json TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS one_live_session_per_slice ON sessions(slice_id) WHERE ended_at IS NULL;
CREATE UNIQUE INDEX IF NOT EXISTS one_session_per_request ON sessions(uid, request_id) WHERE request_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS live_by_uid ON sessions(uid) WHERE ended_at IS NULL;
"""


def ts(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=timezone.utc)


@dataclass(frozen=True)
class Held:
    """A session row with the slice it holds (as the slice was at checkout)."""

    session: Session
    slice: Slice
    last_active: float

    @property
    def expires(self) -> float:
        return self.session.expires_at.timestamp()

    @property
    def created(self) -> float:
        return self.session.created_at.timestamp()


class NoFreeSlice(Exception):
    def __init__(self, busy: list[Held]) -> None:
        super().__init__("no free slice")
        self.busy = busy


class TooManySessions(Exception):
    def __init__(self, live: int, limit: int) -> None:
        super().__init__(f"{live} live sessions, limit {limit}")
        self.live = live
        self.limit = limit


class Registry:
    """Thread-safe; one connection guarded by a lock (SQLite serialises writers anyway)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=30000")
        self._db.executescript(_SCHEMA)
        path.chmod(0o600)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")

    @staticmethod
    def _held(row: sqlite3.Row) -> Held:
        sl = Slice.model_validate_json(row["slice_json"])
        s = Session(
            id=row["id"],
            slice_id=row["slice_id"],
            kind=sl.kind,
            profile=sl.profile,
            gpu_index=sl.gpu_index,
            uid=row["uid"],
            gid=row["gid"],
            user=row["user"],
            created_at=ts(row["created_at"]),
            expires_at=ts(row["expires_at"]),
            notice_sent=bool(row["notice_sent"]),
            ended_at=ts(row["ended_at"]) if row["ended_at"] is not None else None,
            end_reason=row["end_reason"],
            env=json.loads(row["env_json"]),
        )
        return Held(session=s, slice=sl, last_active=row["last_active"])

    def live(self, uid: int | None = None) -> list[Held]:
        with self._lock:
            if uid is None:
                rows = self._db.execute("SELECT * FROM sessions WHERE ended_at IS NULL ORDER BY created_at").fetchall()
            else:
                rows = self._db.execute(
                    "SELECT * FROM sessions WHERE ended_at IS NULL AND uid=? ORDER BY created_at", (uid,)
                ).fetchall()
        return [self._held(r) for r in rows]

    def get(self, session_id: str) -> Held | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone()
        return self._held(row) if row else None

    def checkout(
        self,
        candidates: Sequence[Slice],
        *,
        session_id: str,
        uid: int,
        gid: int,
        user: str,
        now: float,
        ttl: float,
        max_sessions: int | None,
        request_id: str | None,
        env_for: dict[str, dict[str, str]],
    ) -> tuple[Held, bool]:
        """Bind the first free candidate to ``uid``; returns (held, created). Raises NoFreeSlice/TooManySessions."""
        with self._tx() as db:
            if request_id:
                row = db.execute("SELECT * FROM sessions WHERE uid=? AND request_id=?", (uid, request_id)).fetchone()
                if row is not None:
                    return self._held(row), False
            live = db.execute("SELECT COUNT(*) FROM sessions WHERE ended_at IS NULL AND uid=?", (uid,)).fetchone()[0]
            if max_sessions is not None and live >= max_sessions:
                raise TooManySessions(live, max_sessions)
            busy = {r[0] for r in db.execute("SELECT slice_id FROM sessions WHERE ended_at IS NULL")}
            for sl in candidates:
                if sl.id in busy:
                    continue
                sid = session_id
                db.execute(
                    "INSERT INTO sessions(id, slice_id, uid, gid, user, request_id, created_at, expires_at,"
                    " last_active, slice_json, env_json) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        sid,
                        sl.id,
                        uid,
                        gid,
                        user,
                        request_id,
                        now,
                        now + ttl,
                        now,
                        sl.model_dump_json(),
                        json.dumps(env_for.get(sl.id, {})),
                    ),
                )
                row = db.execute("SELECT * FROM sessions WHERE id=?", (sid,)).fetchone()
                return self._held(row), True
            cand = {c.id for c in candidates}
            rows = db.execute("SELECT * FROM sessions WHERE ended_at IS NULL ORDER BY expires_at").fetchall()
            raise NoFreeSlice([h for h in map(self._held, rows) if h.session.slice_id in cand])

    def end(self, session_id: str, reason: EndReason, now: float) -> Held | None:
        """End a live session; None when it was not live (already ended or unknown)."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE sessions SET ended_at=?, end_reason=? WHERE id=? AND ended_at IS NULL",
                (now, reason, session_id),
            )
            if cur.rowcount != 1:
                return None
            row = db.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone()
        return self._held(row)

    def extend(self, session_id: str, new_expiry: float) -> Held | None:
        with self._tx() as db:
            cur = db.execute(
                "UPDATE sessions SET expires_at=?, notice_sent=0 WHERE id=? AND ended_at IS NULL",
                (new_expiry, session_id),
            )
            if cur.rowcount != 1:
                return None
            row = db.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone()
        return self._held(row)

    def mark_notice(self, session_id: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE sessions SET notice_sent=1 WHERE id=?", (session_id,))

    def touch(self, session_id: str, now: float) -> None:
        with self._tx() as db:
            db.execute("UPDATE sessions SET last_active=? WHERE id=? AND ended_at IS NULL", (now, session_id))
