"""``calque session report``: slice-hours per user and profile, from the registry's usage table.

A usage row is written in the same transaction that ends a session (``Registry.end``), so the report
agrees with the registry exactly, costs one indexed query instead of a pass over the audit log, and
cannot be forged by anything written to a log file.
"""

from __future__ import annotations

from datetime import datetime

from calque.models.session import UsageReport, UsageRow
from calque.session.daemon.registry import Registry


def usage_report(registry: Registry, since: datetime, until: datetime, uid: int | None) -> UsageReport:
    """Sessions and GPU-hours overlapping [since, until] per (user, profile, kind); ``uid``'s rows only when given."""
    rows = registry.usage(since.timestamp(), until.timestamp(), uid)
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
