"""Drains (``calque session drain``): no new checkout on a drained GPU or host; the sessions already
there run to their own deadlines, or, when the drain names one (``--by``), to that one.

A drain is a row of the registry's ``drains`` table, so it survives a daemon restart; a checkout reads
the table in its own transaction (``Registry.checkout``), so a drain is never missed by a checkout
that commits after it. A deadline is written into each session's own ``expires_at`` in the drain's
transaction: the timers end those sessions exactly as they end an expiry (notices first, then
SIGTERM, the grace, SIGKILL), and a restart keeps every moved deadline. ``extend`` never passes it.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from calque.models.session import Drain
from calque.session.daemon.registry import Registry
from calque.session.daemon.rows import Held, covering, drain_of, held_of
from calque.session.daemon.schema import HOST_WIDE

# The live sessions a drain covers: every one for the host, else those on its GPU.
_IN_SCOPE = "ended_at IS NULL AND (:gpu = -1 OR json_extract(slice_json, '$.gpu_index') = :gpu)"


@dataclass(frozen=True)
class Drained:
    drain: Drain
    sessions: list[Held]  # live there now, with their deadlines as the drain left them
    shortened: dict[str, float]  # session id -> its deadline before the drain moved it in


def listed(registry: Registry) -> list[Drain]:
    """Every drain of this host, the host's own first."""
    return [drain_of(r) for r in registry.query("SELECT * FROM drains ORDER BY gpu")]


def drain_covering(registry: Registry, gpu: int) -> Drain | None:
    return covering(listed(registry), gpu)


def drain(
    registry: Registry, gpu: int | None, *, reason: str, by_user: str, by_uid: int, now: float, within: float | None
) -> Drained:
    """Drain ``gpu`` (None: the host), replacing an earlier drain of it; with ``within`` (seconds),
    every live session there that would end later now ends at ``now + within``. A deadline is only
    ever moved in: draining again without one leaves the sessions as they are."""
    key = HOST_WIDE if gpu is None else gpu
    deadline = now + within if within is not None else None

    def op(db: sqlite3.Connection) -> tuple[sqlite3.Row, list[sqlite3.Row], dict[str, float]]:
        db.execute(
            "INSERT OR REPLACE INTO drains(gpu, reason, by_user, by_uid, since, deadline) VALUES (?,?,?,?,?,?)",
            (key, reason, by_user, by_uid, now, deadline),
        )
        moved: dict[str, float] = {}
        if deadline is not None:
            scope = {"gpu": key, "deadline": deadline}
            later = f"SELECT id, expires_at FROM sessions WHERE {_IN_SCOPE} AND expires_at > :deadline"
            moved = {r["id"]: r["expires_at"] for r in db.execute(later, scope)}
            # notice_sent=0: the end notices run again before the new deadline, as after an extension.
            db.execute(
                f"UPDATE sessions SET expires_at=:deadline, notice_sent=0 WHERE {_IN_SCOPE} AND expires_at > :deadline",
                scope,
            )
        row = db.execute("SELECT * FROM drains WHERE gpu=?", (key,)).fetchone()
        live = db.execute(f"SELECT * FROM sessions WHERE {_IN_SCOPE} ORDER BY expires_at", {"gpu": key}).fetchall()
        return row, live, moved

    row, live, moved = registry.transaction(op)
    return Drained(drain_of(row), [held_of(r) for r in live], moved)


def undrain(registry: Registry, gpu: int | None) -> list[Drain]:
    """End the drain of ``gpu``, or (None) every drain of the host; returns the drains ended."""

    def op(db: sqlite3.Connection) -> list[sqlite3.Row]:
        where, params = ("", ()) if gpu is None else (" WHERE gpu=?", (gpu,))
        rows = db.execute("SELECT * FROM drains" + where + " ORDER BY gpu", params).fetchall()
        db.execute("DELETE FROM drains" + where, params)
        return rows

    return [drain_of(r) for r in registry.transaction(op)]
