"""The session registry: SQLite in WAL mode with synchronous=FULL, one transaction per change.

A partial unique index (one live session per slice) makes a double assignment impossible even if
the code above it were wrong; ``BEGIN IMMEDIATE`` serialises writers across threads and processes.
A commit happens before any answer goes out, so a client that was told "granted" survives a
``kill -9`` of the daemon. Changes go through the group-committed writer (``groupcommit.py``); the
checkout's transaction is ``checkout_transaction.py``, the usage report's query ``usage.py``.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from calque.models.session import EndReason, Slice
from calque.session.daemon import schema
from calque.session.daemon.checkout_transaction import bind_first_free, checkout_answer
from calque.session.daemon.demand import Ask
from calque.session.daemon.groupcommit import GroupCommit, connect
from calque.session.daemon.hostlock import HostLock
from calque.session.daemon.migrate import migrate
from calque.session.daemon.rows import Held, held_of, slice_of
from calque.session.files import lock_path, open_private, private_directory, secure_existing

T = TypeVar("T")


class Registry:
    """Thread-safe: writes are group-committed (``GroupCommit``), reads use a second connection."""

    def __init__(self, path: Path) -> None:
        # SQLite opens these by name: the directory must be ours alone and the files ours, 0600,
        # before it does (it creates -wal and -shm with the database file's mode).
        private_directory(path.parent, "state directory")
        for suffix in ("-wal", "-shm"):
            secure_existing(path.with_name(path.name + suffix), "registry file")
        os.close(open_private(path, os.O_RDWR, "session registry"))
        self.path = path
        db = connect(path)
        try:
            migrate(db, path)
        except BaseException:
            db.close()
            raise
        self._rdb = connect(path)
        self._rlock = threading.Lock()
        # Serialises writers of every daemon process (no SQLite busy back-off sleeps between them).
        self._writer = GroupCommit(db, HostLock(lock_path(path, "write")))

    def close(self) -> None:
        with self._writer.lock, self._rlock:
            self._rdb.close()
            self._writer.db.close()
        self._writer.lock.close()

    def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` in a write transaction of its own (group-committed with the others): ``drains.py``'s."""
        return self._writer.write(fn)

    def live(self, uid: int | None = None) -> list[Held]:
        with self._rlock:
            if uid is None:
                rows = self._rdb.execute("SELECT * FROM sessions WHERE ended_at IS NULL ORDER BY created_at").fetchall()
            else:
                rows = self._rdb.execute(
                    "SELECT * FROM sessions WHERE ended_at IS NULL AND uid=? ORDER BY created_at", (uid,)
                ).fetchall()
        return [held_of(r) for r in rows]

    def get(self, session_id: str) -> Held | None:
        with self._rlock:
            row = self._rdb.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone()
        return held_of(row) if row else None

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
        env_for: Callable[[Slice], dict[str, str]],
        mps_one_user_per_daemon: bool = True,
        group_limits: Mapping[str, int] | None = None,
        ask: Ask | None = None,
    ) -> tuple[Held, bool]:
        """Bind the first free candidate to ``uid``; returns (held, created). Raises NoFreeSlice/TooManySessions.

        ``group_limits``: the caller's groups that have a session limit, each counted over all of the
        group's members (Slurm's GrpTRES), in the same transaction as the caller's own count.
        ``ask``: what the caller asked for; a refusal for want of a free slice is recorded as demand
        in the same transaction, and a grant ends the ask it continues (``demand.py``)."""
        groups = dict(group_limits or {})
        found = self._writer.write(
            lambda db: bind_first_free(
                db,
                candidates,
                session_id=session_id,
                uid=uid,
                gid=gid,
                user=user,
                now=now,
                ttl=ttl,
                max_sessions=max_sessions,
                request_id=request_id,
                env_for=env_for,
                mps_one_user_per_daemon=mps_one_user_per_daemon,
                groups=groups,
                ask=ask,
            )
        )
        return checkout_answer(found, candidates, session_id=session_id, uid=uid, gid=gid, user=user, now=now, ttl=ttl)

    def _update(
        self,
        session_id: str,
        sql: str,
        params: tuple[Any, ...],
        then: Callable[[sqlite3.Connection, sqlite3.Row], None] | None = None,
    ) -> Held | None:
        """Run ``sql`` on one session row; when it changed the row, ``then`` runs in the same
        transaction with the row as it now is. None when nothing changed."""

        def op(db: sqlite3.Connection) -> sqlite3.Row | None:
            if db.execute(sql, params).rowcount != 1:
                return None
            row: sqlite3.Row = db.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone()
            if then is not None:
                then(db, row)
            return row

        row = self._writer.write(op)
        return held_of(row) if row is not None else None

    def end(self, session_id: str, reason: EndReason, now: float, *, owner: int | None = None) -> Held | None:
        """End a live session (only if ``owner``'s, when given) and write its usage row, in one
        transaction; None when there was no such live session."""
        sql = "UPDATE sessions SET ended_at=?, end_reason=? WHERE id=? AND ended_at IS NULL"
        params: tuple[Any, ...] = (now, reason, session_id)
        if owner is not None:
            sql, params = sql + " AND uid=?", (*params, owner)

        def record_usage(db: sqlite3.Connection, row: sqlite3.Row) -> None:
            sl = slice_of(row["slice_json"])
            usage = (row["uid"], row["user"], sl.kind, sl.profile, sl.gpu_index, row["slice_id"], row["created_at"])
            db.execute(schema.INSERT_USAGE, (session_id, *usage, now, reason))
            db.execute("DELETE FROM live_group_sessions WHERE session_id=?", (session_id,))
            db.execute("INSERT OR REPLACE INTO last_holder(slice_id, uid) VALUES (?,?)", (row["slice_id"], row["uid"]))

        return self._update(session_id, sql, params, then=record_usage)

    def query(self, sql: str, params: dict[str, Any] | Sequence[Any] = ()) -> list[sqlite3.Row]:
        """Rows of a read on the read connection (the ledger's, the drains' and the usage report's queries)."""
        with self._rlock:
            return self._rdb.execute(sql, params).fetchall()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """One durable write through the batched writer (the ledger's overrides)."""
        self._writer.write(lambda db: db.execute(sql, params))

    def extend(self, session_id: str, new_expiry: float) -> Held | None:
        return self._update(
            session_id,
            "UPDATE sessions SET expires_at=?, notice_sent=0 WHERE id=? AND ended_at IS NULL",
            (new_expiry, session_id),
        )

    def mark_notice(self, session_id: str, sent: int = 1) -> None:
        """``sent`` end notices are done for this deadline (an extension starts them again)."""
        self._update(session_id, "UPDATE sessions SET notice_sent=? WHERE id=?", (sent, session_id))

    def touch(self, session_ids: Sequence[str], now: float) -> None:
        """These slices were seen active: their idle clocks start again (and an idle notice may come
        again), all in one transaction."""
        if not session_ids:
            return

        def op(db: sqlite3.Connection) -> None:
            db.executemany(
                "UPDATE sessions SET last_active=?, idle_notice_sent=0 WHERE id=? AND ended_at IS NULL",
                [(now, sid) for sid in session_ids],
            )

        self._writer.write(op)

    def mark_idle_notice(self, session_id: str) -> None:
        self._update(session_id, "UPDATE sessions SET idle_notice_sent=1 WHERE id=?", (session_id,))
