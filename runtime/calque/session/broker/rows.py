"""The broker queue file's schema and its rows as Python sees them (``store.py`` reads and writes them)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from calque.errors import RefusedError
from calque.session.broker.fairness import Waiting

SCHEMA_VERSION = 4  # 2: requests.granting_at and only_host, the strays table; 3: reservations; 4: requests.gpu
SCHEMA = """
CREATE TABLE IF NOT EXISTS requests(
  id TEXT PRIMARY KEY,
  seq INTEGER NOT NULL,
  uid INTEGER NOT NULL,
  user TEXT NOT NULL,
  lab TEXT NOT NULL,
  kind TEXT NOT NULL,
  profile TEXT,
  ttl REAL,
  consent INTEGER NOT NULL,
  wait INTEGER NOT NULL,
  enqueued_at REAL NOT NULL,
  wait_until REAL,
  state TEXT NOT NULL,
  host TEXT,
  session_id TEXT,
  session_json TEXT,
  granted_at REAL,
  ends_at REAL,
  held_until REAL,
  mailed_before REAL,
  note TEXT,
  granting_at REAL,
  only_host TEXT,
  reservation TEXT,
  gpu INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS requests_by_seq ON requests(seq);
CREATE INDEX IF NOT EXISTS live_requests ON requests(state, seq) WHERE state IN ('queued', 'granting', 'held');
CREATE INDEX IF NOT EXISTS granted_requests ON requests(ends_at) WHERE granted_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS last_host(uid INTEGER PRIMARY KEY, host TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS host_ledgers(host TEXT PRIMARY KEY, taken_at REAL NOT NULL, body TEXT NOT NULL)
  WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS budget_notices(lab TEXT NOT NULL, month TEXT NOT NULL, state TEXT NOT NULL,
  at REAL NOT NULL, PRIMARY KEY(lab, month, state)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS strays(request_id TEXT PRIMARY KEY, host TEXT NOT NULL, since REAL NOT NULL)
  WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS reservations(name TEXT PRIMARY KEY, body TEXT NOT NULL, created_at REAL NOT NULL)
  WITHOUT ROWID;
"""
# host_ledgers: each host's last full ledger answer (what a report shows, marked stale, while the host
# is down); budget_notices: each lab's notice and over-budget mail, once a month; strays: requests
# that ended while a host might hold a session for them; reservations: each class reservation's body
# (``models.reservation.Reservation`` as JSON, ``reservations.py``). All additive.
# Columns an older file lacks, added on open: when its current grant began; the one host a checkout made
# on a host of the institution asks for (that host or wait for it); the reservation a member's checkout
# is made under (``holding.py``); the GPU of ``only_host`` a ``checkout --gpu N`` there asks for.
ADDED_COLUMNS = (("granting_at", "REAL"), ("only_host", "TEXT"), ("reservation", "TEXT"), ("gpu", "INTEGER"))
# Ends nobody may have been told of (the client was gone, or its host silent): `queue` shows them a day.
ENDED_UNGRANTED = ("expired", "dropped")


class TooManyQueued(RefusedError):
    """The user already holds the configured number of live queued requests."""


@dataclass(frozen=True)
class Row:
    """One request as the store has it."""

    id: str
    seq: int
    uid: int
    user: str
    lab: str
    kind: str
    profile: str | None
    ttl: float | None
    consent: bool
    wait: bool
    enqueued_at: float
    wait_until: float | None
    state: str
    host: str | None
    session_id: str | None
    session_json: str | None
    granted_at: float | None
    ends_at: float | None
    held_until: float | None
    mailed_before: float | None
    note: str | None
    granting_at: float | None  # when its current grant began (the bound on a silent host counts from it)
    only_host: str | None = None  # a checkout made on a host of the institution: that host or wait for it
    reservation: str | None = None  # made under this reservation: ahead of the queue, within its window
    gpu: int | None = None  # ``checkout --gpu N`` on ``only_host``: that GPU's slices only

    @property
    def waiting(self) -> Waiting:
        w = (self.id, self.seq, self.uid, self.user, self.lab, self.kind, self.profile, self.ttl, self.enqueued_at)
        return Waiting(*w, host=self.only_host, reservation=self.reservation, gpu=self.gpu)

    @property
    def session(self) -> dict[str, Any] | None:
        return json.loads(self.session_json) if self.session_json else None


def row_of(r: sqlite3.Row | None) -> Row | None:
    if r is None:
        return None
    doc = {k: r[k] for k in r.keys()}  # noqa: SIM118 (a sqlite3.Row is no dict: no `in`)
    doc["consent"], doc["wait"] = bool(doc["consent"]), bool(doc["wait"])
    return Row(**doc)


@dataclass(frozen=True)
class NewRequest:
    id: str
    uid: int
    user: str
    lab: str
    kind: str
    profile: str | None
    ttl: float | None
    consent: bool
    wait: bool
    now: float
    wait_until: float | None
    only_host: str | None = None
    reservation: str | None = None
    note: str | None = None  # why its TTL is shorter than asked (holding.py)
    gpu: int | None = None  # with only_host: that host's GPU
