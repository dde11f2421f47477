"""``calque session report``: slice-hours per user and profile, from the registry's usage table.

A usage row is written in the same transaction that ends a session (``Registry.end``), so the report
agrees with the registry exactly, costs one indexed query instead of a pass over the audit log, and
cannot be forged by anything written to a log file.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime

from calque.models.session import UsageReport, UsageRow
from calque.session.daemon.registry import Registry


def usage_rows(registry: Registry, since: float, until: float, uid: int | None) -> list[sqlite3.Row]:
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
    return registry.query(sql, {"since": since, "until": until, "uid": uid})


def usage_report(registry: Registry, since: datetime, until: datetime, uid: int | None) -> UsageReport:
    """Sessions and GPU-hours overlapping [since, until] per (user, profile, kind); ``uid``'s rows only when given."""
    rows = usage_rows(registry, since.timestamp(), until.timestamp(), uid)
    return UsageReport(
        since=since,
        until=until,
        rows=[
            UsageRow(
                uid=r["uid"],
                user=r["user"],
                profile=r["profile"],
                kind=r["kind"],
                sessions=r["sessions"],
                gpu_hours=round((r["seconds"] or 0.0) / 3600, 4),
            )
            for r in rows
        ],
    )
