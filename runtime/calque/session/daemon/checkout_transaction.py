"""A checkout's transaction (``Registry.checkout``): the SQL that binds a free slice, and the answer
built from what it saw.

Apart from the registry because it is the one change with rules of its own (the caller's and their
groups' limits, drains, MPS daemons another user holds, demand), and apart from ``checkout.py``
(which decides the candidates and what the caller is told) because all of it runs under the commit
lock that every writer on the host waits on: only SQL runs there, and the answer is built from what
the transaction saw once it has committed.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence

from calque.models.session import Session, Slice
from calque.session.daemon import schema
from calque.session.daemon.demand import Ask, record_grant, record_refusal
from calque.session.daemon.rows import (
    AllDrained,
    Busy,
    Created,
    Held,
    NoFreeSlice,
    TooManySessions,
    covering,
    drain_of,
    held_of,
    slice_json,
)
from calque.timefmt import utc_moment


def bind_first_free(
    db: sqlite3.Connection,
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
    mps_one_user_per_daemon: bool,
    groups: Mapping[str, int],
    ask: Ask | None,
) -> sqlite3.Row | Created | Busy:
    """In the checkout's write transaction: a retried request's row, else the first free candidate
    bound to ``uid`` (Created), else what was seen instead (Busy). Raises TooManySessions."""
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
                "SELECT DISTINCT daemon FROM sessions WHERE ended_at IS NULL AND daemon IS NOT NULL AND uid != ?",
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


def checkout_answer(
    found: sqlite3.Row | Created | Busy,
    candidates: Sequence[Slice],
    *,
    session_id: str,
    uid: int,
    gid: int,
    user: str,
    now: float,
    ttl: float,
) -> tuple[Held, bool]:
    """(held, created) from what ``bind_first_free`` committed; raises AllDrained or NoFreeSlice."""
    if isinstance(found, sqlite3.Row):
        return held_of(found), False
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
            created_at=utc_moment(now),
            expires_at=utc_moment(now + ttl),
            env=env,
        )
        return Held(session=s, slice=sl, last_active=now, handed_from=found.previous_uid), True
    drained = [drain_of(r) for r in found.drains]
    if drained and all(covering(drained, c.gpu_index) for c in candidates):
        raise AllDrained(drained)
    cand = {c.id for c in candidates}
    held = list(map(held_of, found.rows))
    daemons = {c.pipe_directory for c in candidates if c.kind == "mps"} if found.skipped_mps else set()
    raise NoFreeSlice(
        [h for h in held if h.session.slice_id in cand],
        [h for h in held if h.slice.kind == "mps" and h.slice.pipe_directory in daemons and h.session.uid != uid],
        drained,
    )
