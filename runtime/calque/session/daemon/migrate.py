"""Bringing a registry file to this calque's schema: in one transaction, every row kept; a newer one refused."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from calque.errors import InfrastructureError
from calque.session.daemon import schema


def _run_script(db: sqlite3.Connection, script: str) -> None:
    """Each statement of ``script`` inside the caller's transaction (``executescript`` would commit it)."""
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring an older registry to SCHEMA_VERSION in one transaction (rows kept); refuse a newer one."""
    db.execute("BEGIN IMMEDIATE")
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > schema.SCHEMA_VERSION:
            raise InfrastructureError(
                f"{path} is a schema {version} registry, newer than this calque's {schema.SCHEMA_VERSION}; "
                "upgrade calque on this host"
            )
        if version == 2:
            _run_script(db, schema.USAGE_V2_TO_V3)
        _run_script(db, schema.SCHEMA)
        _run_script(db, schema.DEMAND_SCHEMA)
        db.execute(schema.DEMAND_SINCE, (repr(time.time()),))  # kept from the first time (INSERT OR IGNORE)
        columns = {r[1] for r in db.execute("PRAGMA table_info(sessions)")}
        if "idle_notice_sent" not in columns:
            db.execute(schema.IDLE_NOTICE_V3_TO_V4)
        if version < 2:
            db.execute(schema.BACKFILL_USAGE)
        if version < schema.SCHEMA_VERSION:
            db.execute(f"PRAGMA user_version={schema.SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
