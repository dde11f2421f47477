"""A registry row as the daemon uses it (``Held``: the session and the slice it holds) and what a
checkout's transaction can answer (created, busy, too many), apart from the SQL that makes them."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from calque.models.session import Drain, Session, Slice
from calque.session.daemon.schema import HOST_WIDE
from calque.timefmt import utc_moment

SLICE_CACHE = 4096  # parsed slice_json texts kept; a host has far fewer distinct slices


_slice_cache: dict[str, Slice] = {}


def slice_of(text: str) -> Slice:
    """The Slice a row's slice_json holds. Parsed once per distinct text: pydantic validation was a
    large part of every read. Slices are never changed after they are built, so sharing one is safe."""
    sl = _slice_cache.get(text)
    if sl is None:
        if len(_slice_cache) >= SLICE_CACHE:
            _slice_cache.clear()
        sl = _slice_cache[text] = Slice.model_validate_json(text)
    return sl


_slice_json_cache: dict[int, tuple[Slice, str]] = {}


def slice_json(sl: Slice) -> str:
    """``sl`` as the JSON a row keeps, serialised once per Slice object (the inventory hands out the
    same objects until the layout changes); the object is kept with its text so its id is not reused."""
    hit = _slice_json_cache.get(id(sl))
    if hit is None or hit[0] is not sl:
        if len(_slice_json_cache) >= SLICE_CACHE:
            _slice_json_cache.clear()
        hit = _slice_json_cache[id(sl)] = (sl, sl.model_dump_json())
    return hit[1]


@dataclass(frozen=True)
class Held:
    """A session row with the slice it holds (as the slice was at checkout)."""

    session: Session
    slice: Slice
    last_active: float  # the idle clock: when the slice was last seen active (a checkout starts it)
    idle_notice: bool = False  # the idle notice went out since then
    handed_from: int | None = None  # a fresh checkout: the slice's last holder, when another uid
    notices: int = 0  # end notices sent since the deadline last moved (config: notice_before, final_notice_before)

    @property
    def expires(self) -> float:
        return self.session.expires_at.timestamp()

    @property
    def created(self) -> float:
        return self.session.created_at.timestamp()


def held_of(row: sqlite3.Row) -> Held:
    """A ``sessions`` row as the daemon uses it."""
    sl = slice_of(row["slice_json"])
    env = json.loads(row["env_json"])
    if "CALQUE_SESSION_EXPIRES" in env:  # the deadline as it is now, after any extension
        env["CALQUE_SESSION_EXPIRES"] = utc_moment(row["expires_at"]).isoformat()
    s = Session(
        id=row["id"],
        slice_id=row["slice_id"],
        kind=sl.kind,
        profile=sl.profile,
        gpu_index=sl.gpu_index,
        uid=row["uid"],
        gid=row["gid"],
        user=row["user"],
        created_at=utc_moment(row["created_at"]),
        expires_at=utc_moment(row["expires_at"]),
        notice_sent=bool(row["notice_sent"]),
        ended_at=utc_moment(row["ended_at"]) if row["ended_at"] is not None else None,
        end_reason=row["end_reason"],
        env=env,
    )
    return Held(
        session=s,
        slice=sl,
        last_active=row["last_active"],
        idle_notice=bool(row["idle_notice_sent"]),
        notices=row["notice_sent"],
    )


@dataclass(frozen=True)
class Created:
    """What a checkout's transaction inserted."""

    slice: Slice
    env: dict[str, str]
    previous_uid: int | None  # the slice's last holder, when it was someone else (its nodes may be open)


@dataclass(frozen=True)
class Busy:
    """A checkout that found no free candidate: the live sessions it saw."""

    rows: list[sqlite3.Row]
    skipped_mps: bool  # a free MPS slot was passed over: another user holds its daemon
    drains: list[sqlite3.Row]  # the drains that passed candidates over


class NoFreeSlice(Exception):
    def __init__(
        self, busy: list[Held], other_users: list[Held] | None = None, drains: list[Drain] | None = None
    ) -> None:
        super().__init__("no free slice")
        self.busy = busy
        self.other_users = other_users or []  # MPS slots free but on a daemon another user holds
        self.drains = drains or []  # candidates passed over: their GPU (or the host) is drained


def drain_of(row: sqlite3.Row) -> Drain:
    """A ``drains`` row as the contract says it (``gpu`` None for the whole host)."""
    deadline = row["deadline"]
    return Drain(
        gpu=None if row["gpu"] == HOST_WIDE else row["gpu"],
        reason=row["reason"],
        by_user=row["by_user"],
        by_uid=row["by_uid"],
        since=utc_moment(row["since"]),
        deadline=utc_moment(deadline) if deadline is not None else None,
    )


def covering(drains: list[Drain], gpu: int) -> Drain | None:
    """The drain that covers ``gpu``: its own, else the host's."""
    return next((d for d in drains if d.gpu == gpu), None) or next((d for d in drains if d.gpu is None), None)


class AllDrained(Exception):
    """Every candidate of a checkout is on a drained GPU (or the host is drained)."""

    def __init__(self, drains: list[Drain]) -> None:
        super().__init__("drained")
        self.drains = drains


class TooManySessions(Exception):
    """The caller's own limit, or (``group`` set) the limit of a group counted over all its members."""

    def __init__(self, live: int, limit: int, group: str | None = None) -> None:
        super().__init__(f"{live} live sessions, limit {limit}" + (f" for group {group}" if group else ""))
        self.live = live
        self.limit = limit
        self.group = group
