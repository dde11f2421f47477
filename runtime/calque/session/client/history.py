"""A session registry's history, read-only, into ``calque.models.mig_history.History``: MIG sessions
and refused asks by profile over a window, the data ``calque.gpu.suggest`` is handed.

``calque gpu mig suggest`` reads it from the registry file itself (the daemon need not run, and a
copy of another host's file reads the same). Opened with SQLite's ``mode=ro``: nothing is written,
nothing is locked against the daemon. The daemon's schema (``session/daemon/schema.py``) is the
writer's; this module only reads the tables it names, and says so plainly when a file is not a
registry, predates demand records (schema 5) or holds nothing in the window.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from calque.errors import UsageError
from calque.models.mig_history import History, Refusal, Use

DEMAND_SCHEMA = 5  # the first registry schema with demand records


_USES = """
SELECT session_id, profile, gpu, started_at, ended_at FROM usage
WHERE kind='mig' AND ended_at >= :since AND started_at <= :until
UNION ALL
SELECT id, json_extract(slice_json, '$.profile'), json_extract(slice_json, '$.gpu_index'), created_at, :until
FROM sessions WHERE ended_at IS NULL AND json_extract(slice_json, '$.kind')='mig' AND created_at <= :until
ORDER BY 4
"""
_REFUSALS = """
SELECT profile, first_at, last_at, attempts, session_id FROM demand
WHERE kind='mig' AND first_at >= :since AND first_at <= :until ORDER BY first_at
"""


def read_history(path: Path, since: float, until: float) -> History:
    """The MIG history of the registry at ``path`` in [since, until]; a UsageError that says what is wrong otherwise."""
    if not path.exists():
        raise UsageError(
            f"no session registry at {path}; pass --registry with the session daemon's db file "
            "(the `db` of /etc/calque/session.yaml)"
        )
    if not path.is_file():
        raise UsageError(f"{path} is not a file; pass --registry with the session daemon's db file")
    if not os.access(path, os.R_OK):
        raise PermissionError(f"{path}: the session registry is readable by root only; run this as root")
    if path.stat().st_size == 0:
        raise UsageError(f"{path} is empty: not a session registry (the daemon writes its tables when it starts)")
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return _read(db, path, since, until)
    except sqlite3.DatabaseError as exc:
        raise UsageError(f"{path} is not a session registry this calque can read (SQLite: {exc})") from exc
    finally:
        db.close()


def _read(db: sqlite3.Connection, path: Path, since: float, until: float) -> History:
    version = db.execute("PRAGMA user_version").fetchone()[0]
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not {"sessions", "usage"} <= tables:
        raise UsageError(f"{path} is not a session registry: it has no sessions and usage tables")
    if version < DEMAND_SCHEMA or "demand" not in tables:
        raise UsageError(
            f"{path} is a schema {version} registry, which records no refused checkouts (schema "
            f"{DEMAND_SCHEMA} does): restart the session daemon with this calque to migrate it, then let "
            "demand accumulate before asking for a suggestion"
        )
    meta = dict(db.execute("SELECT key, value FROM registry_meta").fetchall()) if "registry_meta" in tables else {}
    recorded = meta.get("demand_recorded_since")
    params = {"since": since, "until": until}
    uses = [
        Use(str(sid), str(p), int(g), float(s), float(e))
        for sid, p, g, s, e in db.execute(_USES, params)
        if p is not None and g is not None
    ]
    refusals = [
        Refusal(str(p), float(f), float(last), int(n), gr) for p, f, last, n, gr in db.execute(_REFUSALS, params)
    ]
    return History(
        str(path), since, until, float(recorded) if recorded is not None else None, uses=uses, refusals=refusals
    )
