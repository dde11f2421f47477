"""Demand records: the checkouts refused for want of a free slice, written in the checkout's own
transaction (``Registry.checkout``), so no refusal is answered that the registry does not hold.

One ask is one row, however often its client tries: a ``--wait`` loop retries every few seconds and
the broker retries with the same request id, and both add an attempt to the row they started. When a
later try of the same ask is granted, the row names that session: the ask waited, it was not lost.
A request the broker granted after it waited in the broker's queue (``queued_since``) that no host
refused (the broker asks only hosts with a free slice) is recorded at its grant, from the time it
joined the queue.
``calque gpu mig suggest`` reads the rows (``calque.session.client.history``) beside the usage table.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

# Tries of one ask closer together than this are one ask (a --wait loop's delay is at most 5 s).
SAME_ASK_S = 30.0
# A granted try names the ask it ends only if the ask's first refusal is this recent (an index range).
LINK_WITHIN_S = 7 * 86400.0
RECENT_ROWS = 8  # a uid's latest rows looked at for the ask a refusal continues
MIN_QUEUED_S = 1.0  # a broker request that waited less than this in its queue was not kept waiting


@dataclass(frozen=True)
class Ask:
    """What a checkout asked for: its kind, its profile ('' when any slice of the kind would do), its GPU,
    and, from the broker, when the request joined its queue."""

    kind: str
    profile: str
    gpu: int | None = None
    queued_since: float | None = None


def record_refusal(db: sqlite3.Connection, ask: Ask, uid: int, request_id: str | None, now: float) -> None:
    """Count a refused try of ``ask``: a new row, or one more attempt of the ask it continues."""
    rows = db.execute(
        "SELECT first_at, last_at, request_id FROM demand WHERE uid=? AND kind=? AND profile=? AND session_id IS NULL"
        " ORDER BY first_at DESC LIMIT ?",
        (uid, ask.kind, ask.profile, RECENT_ROWS),
    ).fetchall()
    for first_at, last_at, rid in rows:
        if (request_id is not None and rid == request_id) or now - last_at <= SAME_ASK_S:
            db.execute(
                "UPDATE demand SET last_at=MAX(last_at, ?), attempts=attempts+1"
                " WHERE uid=? AND first_at=? AND kind=? AND profile=?",
                (now, uid, first_at, ask.kind, ask.profile),
            )
            return
    db.execute(
        "INSERT OR IGNORE INTO demand(uid, first_at, kind, profile, gpu, last_at, attempts, request_id)"
        " VALUES (?,?,?,?,?,?,1,?)",
        (uid, now, ask.kind, ask.profile, ask.gpu, now, request_id),
    )


def record_grant(
    db: sqlite3.Connection, ask: Ask, uid: int, request_id: str | None, session_id: str, now: float
) -> None:
    """A try of ``ask`` was granted: the open ask it ends (same request id, or refused moments ago)
    names its session; a broker request that waited in the broker's queue with no refusal here is
    recorded from the time it joined the queue (bounded by ``LINK_WITHIN_S``)."""
    linked = db.execute(
        "UPDATE demand SET session_id=? WHERE uid=? AND first_at>=? AND kind=? AND profile=? AND session_id IS NULL"
        " AND ((request_id IS NOT NULL AND request_id IS ?) OR last_at>=?)",
        (session_id, uid, now - LINK_WITHIN_S, ask.kind, ask.profile, request_id, now - SAME_ASK_S),
    ).rowcount
    if linked or ask.queued_since is None:
        return
    since = max(now - LINK_WITHIN_S, min(ask.queued_since, now))
    if now - since >= MIN_QUEUED_S:
        db.execute(
            "INSERT OR IGNORE INTO demand(uid, first_at, kind, profile, gpu, last_at, attempts, request_id, session_id)"
            " VALUES (?,?,?,?,?,?,1,?,?)",
            (uid, since, ask.kind, ask.profile, ask.gpu, now, request_id, session_id),
        )
