"""The broker's durable queue: one SQLite file with the registry's file safety (a private directory,
0600 files opened without following links, WAL with synchronous=FULL, one transaction per change).

A request's id is its client's: a client that retries (its connection dropped, the broker was
restarted) finds its request as it was. A grant is two commits around the host's checkout: the row
goes to ``granting`` on one host before the call, and to ``held`` with the session after. A broker
killed between them finds the row ``granting`` on restart and asks that host, and only that host,
again with the same request id: the host's checkout is idempotent by request id (its registry keeps
one session per (uid, request id)), so a retried grant never takes a second slice.

A ``granting`` row whose host stays silent past a bound ends ``expired``, and one cancelled while
granting ends ``cancelled``; either leaves a *stray* (``strays``): the host may have made a session
for that request id that nobody will claim, so the broker asks that host again, with the same id,
when it answers, and checks in what it gets back.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from calque.errors import InfrastructureError, RefusedError
from calque.session.broker.fairness import Span
from calque.session.broker.rows import (
    ADDED_COLUMNS,
    ENDED_UNGRANTED,
    SCHEMA,
    SCHEMA_VERSION,
    NewRequest,
    Row,
    TooManyQueued,
)
from calque.session.broker.rows import row_of as _row
from calque.session.files import lock_path, open_private, private_directory, secure_existing

__all__ = ["NewRequest", "Row", "Store", "TooManyQueued"]
T = TypeVar("T")


class Store:
    """The queue's file, for one broker process (a second broker on the same file is refused)."""

    def __init__(self, path: Path) -> None:
        private_directory(path.parent, "broker state directory")
        for suffix in ("-wal", "-shm"):
            secure_existing(path.with_name(path.name + suffix), "broker queue file")
        os.close(open_private(path, os.O_RDWR, "broker queue"))
        lock = lock_path(path, "broker")
        private_directory(lock.parent, "lock directory")
        self._lockfd = open_private(lock, os.O_RDWR, "broker lock")
        try:
            fcntl.flock(self._lockfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lockfd)
            raise InfrastructureError(f"another broker is running on {path}; stop it first") from exc
        self.path = path
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._lock = threading.Lock()
        with self._tx() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise InfrastructureError(
                    f"{path} is a schema {version} queue, newer than this calque's; upgrade calque"
                )
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            # An older file keeps its table: the columns it lacks are added (new tables were made above).
            have = {r[1] for r in db.execute("PRAGMA table_info(requests)")}
            for name, decl in ADDED_COLUMNS:
                if name not in have:
                    db.execute(f"ALTER TABLE requests ADD COLUMN {name} {decl}")
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        with self._lock:
            self._db.close()
        os.close(self._lockfd)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction, committed (synchronous=FULL: on disk) before the caller goes on."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            return fn(self._db)

    def get(self, request_id: str) -> Row | None:
        return _row(self._read(lambda db: db.execute("SELECT * FROM requests WHERE id=?", (request_id,)).fetchone()))

    def _rows(self, where: str, params: tuple[Any, ...] = ()) -> list[Row]:
        rows = self._read(
            lambda db: db.execute(f"SELECT * FROM requests WHERE {where} ORDER BY seq", params).fetchall()
        )
        return [r for r in map(_row, rows) if r is not None]

    def live(self) -> list[Row]:
        """Every request still queued, being granted or held for its client, in arrival order."""
        return self._rows("state IN ('queued', 'granting', 'held')")

    def in_state(self, state: str) -> list[Row]:
        return self._rows("state=?", (state,))

    def submit(self, req: NewRequest, *, max_queued: int, state: str = "queued", host: str | None = None) -> Row:
        """The request ``req.id``: the existing row when its client retries, else a new row in ``state``
        (on ``host`` when it is being granted at once). Refused when the id is another user's, or when a
        waiting request would be over the user's cap."""
        with self._tx() as db:
            old = _row(db.execute("SELECT * FROM requests WHERE id=?", (req.id,)).fetchone())
            if old is not None:
                if old.uid != req.uid:
                    raise RefusedError(f"request id {req.id} is another user's; let the client choose its own")
                return old
            if req.wait:
                n = db.execute(
                    "SELECT COUNT(*) FROM requests WHERE uid=? AND wait=1 AND state IN ('queued', 'granting', 'held')",
                    (req.uid,),
                ).fetchone()[0]
                if n >= max_queued:
                    raise TooManyQueued(
                        f"you have {n} request(s) in the queue, the limit is {max_queued}; "
                        "cancel one first (`calque session queue` lists them)"
                    )
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM requests").fetchone()[0]
            db.execute(
                "INSERT INTO requests(id, seq, uid, user, lab, kind, profile, ttl, consent, wait, enqueued_at,"
                " wait_until, state, host, granting_at, only_host, reservation, note, gpu)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    req.id,
                    seq,
                    req.uid,
                    req.user,
                    req.lab,
                    req.kind,
                    req.profile,
                    req.ttl,
                    int(req.consent),
                    int(req.wait),
                    req.now,
                    req.wait_until,
                    state,
                    host,
                    req.now if state == "granting" else None,
                    req.only_host,
                    req.reservation,
                    req.note,
                    req.gpu,
                ),
            )
            new = _row(db.execute("SELECT * FROM requests WHERE id=?", (req.id,)).fetchone())
        assert new is not None
        return new

    def _move(self, request_id: str, sql: str, params: tuple[Any, ...], then: str | None = None) -> Row | None:
        """Run ``sql`` on one row (its last parameter is the id); the row after, None when nothing changed."""
        with self._tx() as db:
            if db.execute(sql, (*params, request_id)).rowcount != 1:
                return None
            row = _row(db.execute("SELECT * FROM requests WHERE id=?", (request_id,)).fetchone())
            if then is not None and row is not None:
                db.execute(then, (row.uid, row.host))
            return row

    def begin_grant(self, request_id: str, host: str, *, from_state: str = "queued") -> Row | None:
        """Bind the request to ``host`` before its checkout there is asked for (committed first)."""
        return self._move(
            request_id,
            "UPDATE requests SET state='granting', host=?, granting_at=? WHERE state=? AND id=?",
            (host, time.time(), from_state),
        )

    def retarget(self, request_id: str, host: str) -> Row | None:
        """A direct try that ``host`` before answered busy (so holds nothing there) moves to ``host``."""
        return self._move(
            request_id, "UPDATE requests SET host=?, granting_at=? WHERE state='granting' AND id=?", (host, time.time())
        )

    def granted(
        self,
        request_id: str,
        session: dict[str, Any],
        *,
        now: float,
        held_until: float,
        ends_at: float,
        claimed: bool = False,
    ) -> Row | None:
        """The host made the session: ``held`` for its client, or ``claimed`` at once when that client
        is the one being answered now (one commit fewer)."""
        return self._move(
            request_id,
            "UPDATE requests SET state=?, session_id=?, session_json=?, granted_at=?, ends_at=?, held_until=?"
            " WHERE state='granting' AND id=?",
            (
                "claimed" if claimed else "held",
                session["id"],
                json.dumps(session),
                now,
                ends_at,
                None if claimed else held_until,
            ),
            then="INSERT OR REPLACE INTO last_host(uid, host) VALUES (?,?)",
        )

    def requeue(self, request_id: str, note: str | None = None) -> Row | None:
        """A grant the host answered busy: the request waits again, in its place (its seq is kept)."""
        return self._move(
            request_id, "UPDATE requests SET state='queued', host=NULL, note=? WHERE state='granting' AND id=?", (note,)
        )

    def claim(self, request_id: str) -> Row | None:
        return self._move(
            request_id, "UPDATE requests SET state='claimed', held_until=NULL WHERE state='held' AND id=?", ()
        )

    def finish(
        self,
        request_id: str,
        state: str,
        note: str | None = None,
        *,
        only: tuple[str, ...] = ("queued", "granting", "held"),
    ) -> Row | None:
        marks = ",".join("?" * len(only))
        return self._move(
            request_id,
            f"UPDATE requests SET state=?, note=?, held_until=NULL WHERE state IN ({marks}) AND id=?",
            (state, note, *only),
        )

    def cancel(self, request_id: str, uid: int | None) -> Row | None:
        """Cancel a queued or granting request, only ``uid``'s when given (in the transaction that
        cancels it). A granting one leaves a stray on its host (what it may have made is checked in)."""
        mine = "" if uid is None else " AND uid=?"
        return self._end_live(
            request_id, "cancelled", None, f"state IN ('queued', 'granting'){mine}", () if uid is None else (uid,)
        )

    def expire_grant(self, request_id: str, note: str) -> Row | None:
        """A grant whose host stayed silent past the bound: ``expired``, a stray left on its host."""
        return self._end_live(request_id, "expired", note, "state='granting'", ())

    def drop(self, request_id: str, note: str) -> Row | None:
        """A queued request whose client went away and did not come back within the claim window."""
        return self.finish(request_id, "dropped", note, only=("queued",))

    def _end_live(
        self, request_id: str, state: str, note: str | None, where: str, params: tuple[Any, ...]
    ) -> Row | None:
        with self._tx() as db:
            sql = f"UPDATE requests SET state=?, note=COALESCE(?, note), held_until=NULL WHERE {where} AND id=?"
            before = _row(db.execute("SELECT * FROM requests WHERE id=?", (request_id,)).fetchone())
            if db.execute(sql, (state, note, *params, request_id)).rowcount != 1:
                return None
            if before is not None and before.state == "granting" and before.host is not None:
                db.execute(
                    "INSERT OR IGNORE INTO strays(request_id, host, since) VALUES (?,?,?)",
                    (request_id, before.host, time.time()),
                )
            return _row(db.execute("SELECT * FROM requests WHERE id=?", (request_id,)).fetchone())

    def stray(self, request_id: str, host: str) -> None:
        """``host`` may hold a session for ``request_id`` that its request no longer wants."""
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO strays(request_id, host, since) VALUES (?,?,?)", (request_id, host, time.time())
            )

    def strays(self) -> list[tuple[Row, str]]:
        """Each stray's request (as it ended) and the host that may hold a session for it."""
        rows = self._read(
            lambda db: db.execute(
                "SELECT r.*, s.host AS stray_host FROM strays s JOIN requests r ON r.id = s.request_id ORDER BY s.since"
            ).fetchall()
        )
        out = []
        for r in rows:
            doc = {k: r[k] for k in r.keys() if k != "stray_host"}  # noqa: SIM118
            doc["consent"], doc["wait"] = bool(doc["consent"]), bool(doc["wait"])
            out.append((Row(**doc), str(r["stray_host"])))
        return out

    def settle_stray(self, request_id: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM strays WHERE request_id=?", (request_id,))

    def ended_ungranted(self, since: float) -> list[Row]:
        """Requests since ``since`` that ended without a grant: ``queue`` says why for a while."""
        marks = ",".join("?" * len(ENDED_UNGRANTED))
        return self._rows(f"state IN ({marks}) AND enqueued_at >= ?", (*ENDED_UNGRANTED, since))

    def extend_holds(self, until: float) -> None:
        """After a restart: a grant held for its client is held at least until ``until`` (its client
        could not reconnect while the broker was down)."""
        with self._tx() as db:
            db.execute("UPDATE requests SET held_until=MAX(held_until, ?) WHERE state='held'", (until,))

    def session_ended(self, host: str, session_id: str, at: float, *, extended: bool = False) -> None:
        """A granted session the host no longer holds: its usage stops at ``at``; ``extended``: one
        extended through the broker, ending at ``at`` now (a reservation counts it as used till then)."""
        with self._tx() as db:
            db.execute(
                f"UPDATE requests SET ends_at={'MAX' if extended else 'MIN'}(ends_at, ?)"
                " WHERE host=? AND session_id=? AND granted_at IS NOT NULL",
                (at, host, session_id),
            )

    def grants(self, since: float, now: float) -> list[Span]:
        """Slices granted through the broker over [since, now], clipped to it (a live session up to now,
        an ended one up to its end as last seen): ``fairness.lab_usage`` adds the hosts' own records."""
        sql = (
            "SELECT lab, host, MAX(granted_at, :since), MIN(ends_at, :now) FROM requests"
            " WHERE granted_at IS NOT NULL AND ends_at >= :since AND granted_at <= :now"
        )
        rows = self._read(lambda db: db.execute(sql, {"since": since, "now": now}).fetchall())
        return [Span(r[0], r[1], float(r[2]), float(r[3])) for r in rows if r[3] > r[2]]

    def mark_mailed(self, request_id: str, before: float) -> None:
        """The notice ``before`` seconds ahead of the session's end was mailed (each is sent once)."""
        with self._tx() as db:
            db.execute("UPDATE requests SET mailed_before=? WHERE id=?", (before, request_id))

    def prune(self, before: float) -> int:
        """Forget requests that ended before ``before`` (the fair-share window's start): rows kept
        past their use would only grow the file."""
        with self._tx() as db:
            n: int = db.execute(
                "DELETE FROM requests WHERE state NOT IN ('queued', 'granting', 'held')"
                " AND COALESCE(ends_at, enqueued_at) < ? AND id NOT IN (SELECT request_id FROM strays)",
                (before,),
            ).rowcount
        return n

    def save_ledger(self, host: str, taken_at: float, body: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO host_ledgers(host, taken_at, body) VALUES (?,?,?)", (host, taken_at, body)
            )

    def last_ledger(self, host: str) -> str | None:
        r = self._read(lambda db: db.execute("SELECT body FROM host_ledgers WHERE host=?", (host,)).fetchone())
        return str(r[0]) if r is not None else None

    def first_budget_notice(self, lab: str, month: str, state: str, at: float) -> bool:
        """Whether this is the first ``state`` notice of ``lab`` in ``month`` (recorded now if so)."""
        with self._tx() as db:
            sql = "INSERT OR IGNORE INTO budget_notices(lab, month, state, at) VALUES (?,?,?,?)"
            return bool(db.execute(sql, (lab, month, state, at)).rowcount)

    def add_reservation(self, name: str, body: str, at: float) -> bool:
        """Keep a reservation (committed before it is answered); False when the name is taken."""
        with self._tx() as db:
            sql = "INSERT OR IGNORE INTO reservations(name, body, created_at) VALUES (?,?,?)"
            return bool(db.execute(sql, (name, body, at)).rowcount)

    def drop_reservation(self, name: str) -> bool:
        with self._tx() as db:
            return bool(db.execute("DELETE FROM reservations WHERE name=?", (name,)).rowcount)

    def reservation_bodies(self) -> list[str]:
        rows = self._read(lambda db: db.execute("SELECT body FROM reservations ORDER BY created_at").fetchall())
        return [str(r[0]) for r in rows]

    def under(self, reservation: str, since: float, now: float) -> list[Row]:
        """Grants made under ``reservation`` since ``since`` whose session is live at ``now``."""
        where = "reservation=? AND state IN ('held', 'claimed') AND granted_at >= ? AND ends_at > ?"
        return self._rows(where, (reservation, since, now))

    def granted_under(self, reservation: str, since: float, until: float) -> list[Row]:
        """Every grant made under ``reservation`` over [since, until), live or ended."""
        where = "reservation=? AND granted_at IS NOT NULL AND granted_at >= ? AND granted_at < ?"
        return self._rows(where, (reservation, since, until))

    def set_ttl(self, request_id: str, ttl: float, note: str) -> Row | None:
        """A waiting request's TTL capped before its grant (a reservation's window ahead), with why."""
        return self._move(request_id, "UPDATE requests SET ttl=?, note=? WHERE state='queued' AND id=?", (ttl, note))

    def last_host(self, uid: int) -> str | None:
        r = self._read(lambda db: db.execute("SELECT host FROM last_host WHERE uid=?", (uid,)).fetchone())
        return str(r[0]) if r is not None else None
