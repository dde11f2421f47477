"""The registry's SQLite schema (version 5: demand records, the checkouts refused for want of a free
slice, and since when they are recorded; and drains, ``calque session drain``; 4: each session's idle
notice beside its idle clock; 3: usage rows clustered by uid and end time; 2 added the usage table and
per-group live counts).

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
CREATE INDEX IF NOT EXISTS usage_ended_at ON usage(ended_at);
CREATE TABLE IF NOT EXISTS budget_overrides(
  lab TEXT NOT NULL,
  month TEXT NOT NULL,
  at REAL NOT NULL,
  extra REAL NOT NULL,
  by_uid INTEGER NOT NULL,
  reason TEXT NOT NULL,
  PRIMARY KEY(lab, month, at)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS budget_elsewhere(
  lab TEXT NOT NULL,
  month TEXT NOT NULL,
  gpu_hours REAL NOT NULL,
  usd REAL NOT NULL,
  at REAL NOT NULL,
  PRIMARY KEY(lab, month)
) WITHOUT ROWID;
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
CREATE TABLE IF NOT EXISTS session_labs(
  session_id TEXT PRIMARY KEY,
  lab TEXT NOT NULL
) WITHOUT ROWID;
"""
# ``session_labs``: the lab each session is billed to, recorded at its checkout (``--lab``, else the
# first lab of institution.yaml naming one of the holder's groups); additive, as the tables below.
# ``last_holder``: who held each slice last (written at every end). A checkout of a slice whose last
# holder was another uid ends that uid's descriptors of its nodes before it answers (the hand-over).
# Additive: an older calque ignores the table, so the schema version stays.
# ``usage_ended_at``: the sessions that ended in a span, for a lab's month at checkout (``daemon_ledger.py``: the
# hours before this one are summed once, the last hour's rows found through it); one page more per end.
# ``budget_overrides``: an admin's extra allowance for a lab in a month (``budget_override``, audited).
# ``budget_elsewhere``: each lab's month on the institution's other hosts, as the broker last summed it.
# Additive, all four: an older calque ignores them (created by every open, as the tables above).
# ``demand``: one row per checkout refused because no slice of its kind and profile was free (exit 5),
# written in the checkout's own transaction. A client that waits (``--wait`` retries, the broker's
# retried request id) adds attempts to its row instead of new rows; when a later try is granted, the
# row names the session it got (the ask waited, it was not lost). ``profile`` is '' when any slice of
# the kind would do. ``calque gpu mig suggest`` reads these rows (``calque.session.client.history``).
DEMAND_TABLE = """demand(
  uid INTEGER NOT NULL,
  first_at REAL NOT NULL,
  kind TEXT NOT NULL,
  profile TEXT NOT NULL,
  gpu INTEGER,
  last_at REAL NOT NULL,
  attempts INTEGER NOT NULL,
  request_id TEXT,
  session_id TEXT,
  PRIMARY KEY(uid, first_at, kind, profile)
) WITHOUT ROWID"""
# ``registry_meta``: facts about the file itself; ``demand_recorded_since`` is when this registry began
# recording refusals (its creation, or its migration to schema 5): before it, refusals are unknown.
DEMAND_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {DEMAND_TABLE};
CREATE INDEX IF NOT EXISTS demand_by_time ON demand(first_at);
CREATE TABLE IF NOT EXISTS registry_meta(
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
) WITHOUT ROWID;
"""
DEMAND_SINCE = "INSERT OR IGNORE INTO registry_meta(key, value) VALUES ('demand_recorded_since', ?)"
# ``drains``: one row per drained GPU, ``gpu`` = HOST_WIDE for the whole host; a checkout's transaction
# reads it, so a drain committed before a checkout is never missed. Made by SCHEMA above, it
# would need no version of its own; schema 5 has one anyway: an older calque would ignore it and hand out
# drained GPUs, so it must refuse a registry that has drains.
SCHEMA_VERSION = 5
HOST_WIDE = -1
# Schema 4 (and older) to 5: DEMAND_SCHEMA, the time recording began (no refusal before it is known), drains.
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
