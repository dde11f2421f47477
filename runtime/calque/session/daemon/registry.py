"""The session registry: SQLite in WAL mode with synchronous=FULL, one transaction per change.

A partial unique index (one live session per slice) makes a double assignment impossible even if
the code above it were wrong; ``BEGIN IMMEDIATE`` serialises writers across threads and processes.
A commit happens before any answer goes out, so a client that was told "granted" survives a
``kill -9`` of the daemon.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from calque.models.session import EndReason, Session, Slice
from calque.session.daemon import schema
from calque.session.daemon.demand import Ask, record_grant, record_refusal
from calque.session.daemon.hostlock import HostLock
from calque.session.daemon.migrate import migrate
from calque.session.daemon.rows import (
    AllDrained,
    Busy,
    Created,
    Held,
    NoFreeSlice,
    TooManySessions,
    covering,
    drain_of,
    slice_json,
    slice_of,
    ts,
)
from calque.session.files import lock_path, open_private, private_directory, secure_existing

T = TypeVar("T")
MAX_BATCH = 256


class Registry:
    """Thread-safe, with group commit. A writer queues its change; whichever writer holds the commit
    lock runs every queued change, each in its own savepoint, inside one transaction and commits
    once. A burst of clients costs one fsync instead of one each, a lone client pays no hand-off to
    another thread, and no caller returns before its change is durable. Reads use a second connection."""

    def __init__(self, path: Path) -> None:
        # SQLite opens these by name: the directory must be ours alone and the files ours, 0600,
        # before it does (it creates -wal and -shm with the database file's mode).
        private_directory(path.parent, "state directory")
        for suffix in ("-wal", "-shm"):
            secure_existing(path.with_name(path.name + suffix), "registry file")
        os.close(open_private(path, os.O_RDWR, "session registry"))
        self.path = path
        self._db = self._connect(path)
        try:
            migrate(self._db, path)
        except BaseException:
            self._db.close()
            raise
        self._rdb = self._connect(path)
        self._rlock = threading.Lock()
        # Serialises writers of every daemon process (no SQLite busy back-off sleeps between them).
        self._commit_lock = HostLock(lock_path(path, "write"))
        self._queue: queue.SimpleQueue[tuple[Callable[[sqlite3.Connection], Any], Future[Any]]] = queue.SimpleQueue()

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=30000")
        return db

    def close(self) -> None:
        with self._commit_lock, self._rlock:
            self._rdb.close()
            self._db.close()
        self._commit_lock.close()

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        fut: Future[T] = Future()
        self._queue.put((fn, fut))
        while not fut.done():
            with self._commit_lock.unless(fut.done) as mine:
                if mine:
                    self._commit_batch()
        return fut.result()

    def _commit_batch(self) -> None:
        """Run and commit everything queued so far (called with the commit lock held)."""
        db = self._db
        batch: list[tuple[Callable[[sqlite3.Connection], Any], Future[Any]]] = []
        while len(batch) < MAX_BATCH:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if not batch:
            return
        outcomes: list[tuple[Future[Any], Any, BaseException | None]] = []
        try:
            db.execute("BEGIN IMMEDIATE")
            if len(batch) == 1:  # alone: its own failure may roll the whole transaction back
                fn, fut = batch[0]
                try:
                    outcomes.append((fut, fn(db), None))
                except Exception as exc:
                    db.execute("ROLLBACK")
                    fut.set_exception(exc)
                    return
                batch_rest: list[tuple[Callable[[sqlite3.Connection], Any], Future[Any]]] = []
            else:
                batch_rest = batch
            for fn, fut in batch_rest:
                db.execute("SAVEPOINT op")
                try:
                    result = fn(db)
                except Exception as exc:
                    db.execute("ROLLBACK TO op")
                    db.execute("RELEASE op")
                    outcomes.append((fut, None, exc))
                else:
                    db.execute("RELEASE op")
                    outcomes.append((fut, result, None))
            db.execute("COMMIT")
        except BaseException as exc:
            # Nothing of this batch is on disk: every caller in it gets the error (none waits forever).
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            for _, fut in batch:
                fut.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
        else:
            for fut, result, err in outcomes:
                if err is not None:
                    fut.set_exception(err)
                else:
                    fut.set_result(result)

    def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` in a write transaction of its own (group-committed with the others): ``drains.py``'s."""
        return self._write(fn)

    @staticmethod
    def _held(row: sqlite3.Row) -> Held:
        sl = slice_of(row["slice_json"])
        env = json.loads(row["env_json"])
        if "CALQUE_SESSION_EXPIRES" in env:  # the deadline as it is now, after any extension
            env["CALQUE_SESSION_EXPIRES"] = ts(row["expires_at"]).isoformat()
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
            env=env,
        )
        return Held(
            session=s,
            slice=sl,
            last_active=row["last_active"],
            idle_notice=bool(row["idle_notice_sent"]),
            notices=row["notice_sent"],
        )

    def live(self, uid: int | None = None) -> list[Held]:
        with self._rlock:
            if uid is None:
                rows = self._rdb.execute("SELECT * FROM sessions WHERE ended_at IS NULL ORDER BY created_at").fetchall()
            else:
                rows = self._rdb.execute(
                    "SELECT * FROM sessions WHERE ended_at IS NULL AND uid=? ORDER BY created_at", (uid,)
                ).fetchall()
        return [self._held(r) for r in rows]

    def get(self, session_id: str) -> Held | None:
        with self._rlock:
            row = self._rdb.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone()
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

        # Under the commit lock (every writer on the host waits on it) only SQL runs: the answer is
        # built from what the transaction saw once it has committed.
        def op(db: sqlite3.Connection) -> sqlite3.Row | Created | Busy:
            if request_id:
                row: sqlite3.Row | None = db.execute(
                    "SELECT * FROM sessions WHERE uid=? AND request_id=?", (uid, request_id)
                ).fetchone()
                if row is not None:
                    return row  # a retried request: its session as it is now
            live = db.execute("SELECT COUNT(*) FROM sessions WHERE ended_at IS NULL AND uid=?", (uid,)).fetchone()[0]
            if max_sessions is not None and live >= max_sessions:
                raise TooManySessions(live, max_sessions)
            for grp, limit in sorted(groups.items()):
                n = db.execute("SELECT COUNT(*) FROM live_group_sessions WHERE grp=?", (grp,)).fetchone()[0]
                if n >= limit:
                    raise TooManySessions(n, limit, grp)
            busy = {r[0] for r in db.execute("SELECT slice_id FROM sessions WHERE ended_at IS NULL")}
            # Read in this transaction (writers are serialised): every drain committed before it is seen,
            # and a drain after it lists the session this one makes.
            drains = {r["gpu"]: r for r in db.execute("SELECT * FROM drains")}
            passed: dict[int, sqlite3.Row] = {}
            # MPS serialises clients of different Unix users on one control daemon: a daemon another
            # user holds a slot of is not offered (docs/gpu-mps.md), unless the host runs multi-user MPS.
            foreign = set()
            if mps_one_user_per_daemon and any(sl.kind == "mps" for sl in candidates):
                foreign = {
                    r[0]
                    for r in db.execute(
                        "SELECT DISTINCT daemon FROM sessions"
                        " WHERE ended_at IS NULL AND daemon IS NOT NULL AND uid != ?",
                        (uid,),
                    )
                }
            skipped = False
            for sl in candidates:
                drain = drains.get(sl.gpu_index, drains.get(schema.HOST_WIDE))
                if drain is not None:
                    passed[drain["gpu"]] = drain
                    continue
                if sl.id in busy:
                    continue
                if sl.kind == "mps" and sl.pipe_directory in foreign:
                    skipped = True
                    continue
                env = env_for(sl)
                db.execute(
                    "INSERT INTO sessions(id, slice_id, uid, gid, user, request_id, created_at, expires_at,"
                    " last_active, slice_json, env_json, daemon) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        session_id,
                        sl.id,
                        uid,
                        gid,
                        user,
                        request_id,
                        now,
                        now + ttl,
                        now,
                        slice_json(sl),
                        json.dumps(env),
                        sl.pipe_directory if sl.kind == "mps" else None,
                    ),
                )
                if groups:
                    db.executemany(
                        "INSERT INTO live_group_sessions(grp, session_id) VALUES (?,?)",
                        [(g, session_id) for g in groups],
                    )
                prev = None
                if sl.kind == "mig":
                    last = db.execute("SELECT uid FROM last_holder WHERE slice_id=?", (sl.id,)).fetchone()
                    prev = last[0] if last is not None and last[0] != uid else None
                if ask is not None:
                    record_grant(db, ask, uid, request_id, session_id, now)
                return Created(sl, env, prev)
            if ask is not None and candidates:  # none offered at all (MPS daemons down) is no want of slices
                record_refusal(db, ask, uid, request_id, now)
            rows = db.execute("SELECT * FROM sessions WHERE ended_at IS NULL ORDER BY expires_at").fetchall()
            return Busy(rows, skipped, [passed[g] for g in sorted(passed)])

        found = self._write(op)
        if isinstance(found, sqlite3.Row):
            return self._held(found), False
        if isinstance(found, Created):
            sl, env = found.slice, found.env
            # Built from what was just inserted, not read back: the same values, one query and parse fewer.
            s = Session(
                id=session_id,
                slice_id=sl.id,
                kind=sl.kind,
                profile=sl.profile,
                gpu_index=sl.gpu_index,
                uid=uid,
                gid=gid,
                user=user,
                created_at=ts(now),
                expires_at=ts(now + ttl),
                env=env,
            )
            return Held(session=s, slice=sl, last_active=now, handed_from=found.previous_uid), True
        drained = [drain_of(r) for r in found.drains]
        if drained and all(covering(drained, c.gpu_index) for c in candidates):
            raise AllDrained(drained)
        cand = {c.id for c in candidates}
        held = list(map(self._held, found.rows))
        daemons = {c.pipe_directory for c in candidates if c.kind == "mps"} if found.skipped_mps else set()
        raise NoFreeSlice(
            [h for h in held if h.session.slice_id in cand],
            [h for h in held if h.slice.kind == "mps" and h.slice.pipe_directory in daemons and h.session.uid != uid],
            drained,
        )

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

        row = self._write(op)
        return self._held(row) if row is not None else None

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

    def usage(self, since: float, until: float, uid: int | None) -> list[sqlite3.Row]:
        """Sessions and seconds per (uid, user, profile, kind) overlapping [since, until]: ended ones
        from the usage table (indexed by end time), live ones counted up to ``until``."""
        mine = "" if uid is None else " AND uid=:uid"
        sql = f"""
            SELECT uid, user, profile, kind, COUNT(*) AS sessions,
                   SUM(MAX(0.0, MIN(ended_at, :until) - MAX(started_at, :since))) AS seconds
            FROM (
              SELECT uid, user, profile, kind, started_at, ended_at FROM usage
              WHERE ended_at >= :since AND started_at <= :until{mine}
              UNION ALL
              SELECT uid, user, json_extract(slice_json, '$.profile'), json_extract(slice_json, '$.kind'),
                     created_at, :until FROM sessions
              WHERE ended_at IS NULL AND created_at <= :until{mine}
            )
            GROUP BY uid, user, profile, kind ORDER BY user, profile, kind"""
        with self._rlock:
            return self._rdb.execute(sql, {"since": since, "until": until, "uid": uid}).fetchall()

    def query(self, sql: str, params: dict[str, Any] | Sequence[Any] = ()) -> list[sqlite3.Row]:
        """Rows of a read on the read connection (the ledger's and the drains' queries)."""
        with self._rlock:
            return self._rdb.execute(sql, params).fetchall()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """One durable write through the batched writer (the ledger's overrides)."""
        self._write(lambda db: db.execute(sql, params))

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

        self._write(op)

    def mark_idle_notice(self, session_id: str) -> None:
        self._update(session_id, "UPDATE sessions SET idle_notice_sent=1 WHERE id=?", (session_id,))
