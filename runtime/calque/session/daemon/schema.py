"""The registry's SQLite schema (version 5: drains, ``calque session drain``; 4: each session's idle
notice beside its idle clock; 3: usage rows clustered by uid and end time; 2 added the usage table
and per-group live counts).

A session's idle clock is ``last_active`` (when its slice was last seen active; a checkout starts it)
and ``idle_notice_sent``: both in the row, so a daemon restart keeps every clock and sends no notice
twice."""

from __future__ import annotations

USAGE_COLUMNS = "session_id, uid, user, kind, profile, gpu, slice_id, started_at, ended_at, end_reason"
# One b-tree, written at every session's end: a user's report is a range of it (uid, then end time),
# an admin's a scan. Schema 2 kept a rowid table with three indexes, four pages written per end.
USAGE_TABLE = """{name}(
  session_id TEXT NOT NULL,
  uid INTEGER NOT NULL,
  user TEXT NOT NULL,
  kind TEXT NOT NULL,
  profile TEXT NOT NULL,
  gpu INTEGER NOT NULL,
  slice_id TEXT NOT NULL,
  started_at REAL NOT NULL,
  ended_at REAL NOT NULL,
  end_reason TEXT NOT NULL,
  PRIMARY KEY(uid, ended_at, session_id)
) WITHOUT ROWID"""

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS sessions(
  id TEXT PRIMARY KEY,
  slice_id TEXT NOT NULL,
  uid INTEGER NOT NULL,
  gid INTEGER NOT NULL,
  user TEXT NOT NULL,
  request_id TEXT,
  created_at REAL NOT NULL,
  expires_at REAL NOT NULL,
  notice_sent INTEGER NOT NULL DEFAULT 0,
  ended_at REAL,
  end_reason TEXT,
  last_active REAL NOT NULL,
  slice_json TEXT NOT NULL,
  env_json TEXT NOT NULL,
  daemon TEXT,
  idle_notice_sent INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS one_live_session_per_slice ON sessions(slice_id) WHERE ended_at IS NULL;
CREATE UNIQUE INDEX IF NOT EXISTS one_session_per_request ON sessions(uid, request_id) WHERE request_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS live_by_uid ON sessions(uid) WHERE ended_at IS NULL;
CREATE TABLE IF NOT EXISTS {USAGE_TABLE.format(name="usage")};
CREATE TABLE IF NOT EXISTS live_group_sessions(
  grp TEXT NOT NULL,
  session_id TEXT NOT NULL,
  PRIMARY KEY(session_id, grp)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS live_group_sessions_by_group ON live_group_sessions(grp);
CREATE TABLE IF NOT EXISTS drains(
  gpu INTEGER PRIMARY KEY,
  reason TEXT NOT NULL,
  by_user TEXT NOT NULL,
  by_uid INTEGER NOT NULL,
  since REAL NOT NULL,
  deadline REAL
);
CREATE TABLE IF NOT EXISTS last_holder(
  slice_id TEXT PRIMARY KEY,
  uid INTEGER NOT NULL
) WITHOUT ROWID;
"""
# ``last_holder``: who held each slice last (written at every end). A checkout of a slice whose last
# holder was another uid ends that uid's descriptors of its nodes before it answers (the hand-over).
# Additive: an older calque ignores the table, so the schema version stays.
# ``drains``: one row per drained GPU, ``gpu`` = HOST_WIDE for the whole host; a checkout's transaction
# reads it, so a drain committed before a checkout is never missed. Schema 4 to 5 is this table alone
# (made by SCHEMA above); the version moves anyway: an older calque would ignore it and hand out
# drained GPUs, so it must refuse a registry that has drains.
SCHEMA_VERSION = 5
HOST_WIDE = -1
# Schema 3 (and older) to 4: the idle notice's column; every live session's clock (last_active) stays.
IDLE_NOTICE_V3_TO_V4 = "ALTER TABLE sessions ADD COLUMN idle_notice_sent INTEGER NOT NULL DEFAULT 0"
# Schema 2 to 3: the same rows into the clustered table (the old table's indexes go with it).
USAGE_V2_TO_V3 = f"""
CREATE TABLE {USAGE_TABLE.format(name="usage_v3")};
INSERT OR IGNORE INTO usage_v3({USAGE_COLUMNS}) SELECT {USAGE_COLUMNS} FROM usage;
DROP TABLE usage;
ALTER TABLE usage_v3 RENAME TO usage;
"""
# Sessions that ended before the usage table existed (schema 1) are copied into it once.
BACKFILL_USAGE = f"""
INSERT OR IGNORE INTO usage({USAGE_COLUMNS})
SELECT id, uid, user, json_extract(slice_json, '$.kind'), json_extract(slice_json, '$.profile'),
       json_extract(slice_json, '$.gpu_index'), slice_id, created_at, ended_at, COALESCE(end_reason, 'vanished')
FROM sessions WHERE ended_at IS NOT NULL
"""
INSERT_USAGE = f"INSERT OR IGNORE INTO usage({USAGE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)"
