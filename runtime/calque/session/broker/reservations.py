"""The broker's reservations (issue 38): made, listed and cancelled here, kept in the queue's file
(its ``reservations`` table: one JSON body per name, one transaction each, so a reservation survives
``kill -9`` as a queued request does).

Who may reserve: root, the broker's admin group, or a manager of a lab (``institution.yaml``'s
``managers``), for that lab. A reservation is refused, with the reason, when the institution cannot
carry it: the hosts' slices of its profile (as the broker last listed them) plus what the fleet
classes may add (``fleet.classes.*.reservable``), against the most that overlapping reservations of
that profile ask at any moment of any of its occurrences.
"""

from __future__ import annotations

import builtins
import grp
import re
from collections.abc import Callable, Mapping
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

from calque.durations import format_duration
from calque.errors import RefusedError, UsageError
from calque.models.base import positive_seconds
from calque.models.reservation import (
    OccurrenceUse,
    Reservation,
    ReservationsArgs,
    ReservationView,
    ReserveArgs,
    UnreserveArgs,
)
from calque.session.broker.broker_config import BrokerConfig
from calque.session.broker.callers import Caller
from calque.session.broker.fairness import lab_of
from calque.session.broker.hosts import HostCache
from calque.session.broker.store import Row, Store

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY_TIME = re.compile(r"^\s*(?:([a-z]{3})[a-z]*\s+)?(\d{1,2}):(\d{2})\s*$", re.IGNORECASE)
Audit = Callable[..., None]


def parse_at(text: str, now: datetime) -> datetime:
    """``tue 14:00`` (the next Tuesday at 14:00, local time; today if still ahead), ``14:00`` (the next
    14:00), or an ISO time (local unless it names its offset)."""
    m = _DAY_TIME.match(text)
    if m is not None:
        day, hour, minute = m.group(1), int(m.group(2)), int(m.group(3))
        if hour > 23 or minute > 59:
            raise UsageError(f"--at {text!r}: no such time of day")
        local = now.astimezone()
        wanted = local.weekday() if day is None else _day(day, text)
        ahead = (wanted - local.weekday()) % 7
        when = datetime.combine(local.date() + timedelta(days=ahead), time(hour, minute)).astimezone()
        if when <= now:
            when = (when.replace(tzinfo=None) + timedelta(days=7 if day else 1)).astimezone()
        return when
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(
            f"--at {text!r} is neither 'DAY HH:MM' (tue 14:00), 'HH:MM' nor an ISO time (2027-01-12T14:00)"
        ) from None
    return when if when.tzinfo is not None else when.astimezone()


def _day(word: str, text: str) -> int:
    try:
        return DAYS.index(word.lower())
    except ValueError:
        raise UsageError(f"--at {text!r}: {word!r} is no day; write mon, tue, wed, thu, fri, sat or sun") from None


def parse_until(text: str) -> datetime:
    """``2027-03-31`` (that whole day, local time) or an ISO time."""
    try:
        day = date.fromisoformat(text.strip())
        return datetime.combine(day, time(23, 59, 59)).astimezone()
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--until {text!r} is not a date (2027-03-31) or an ISO time") from None
    return when if when.tzinfo is not None else when.astimezone()


def peak(spans: list[tuple[datetime, datetime, int]], within: tuple[datetime, datetime]) -> int:
    """The most that ``spans`` (start, end, count) ask at one moment of ``within``."""
    begin, end = within
    edges: list[tuple[datetime, int]] = []
    for s, e, n in spans:
        if s < end and e > begin:
            edges += [(max(s, begin), n), (min(e, end), -n)]
    most = total = 0
    for _, n in sorted(edges, key=lambda x: (x[0], x[1])):  # an end before a start at the same moment
        total += n
        most = max(most, total)
    return most


def _live(r: Row, at: float) -> bool:
    """Whether the session granted for ``r`` held its slice at ``at`` (the broker's view of its end)."""
    return r.granted_at is not None and r.granted_at <= at and (r.ends_at is None or r.ends_at > at)


def fleet_slices(config: BrokerConfig) -> dict[str, int]:
    """Per profile, the slices the fleet classes' hosts hold at their maximum (``reservable``)."""
    out: dict[str, int] = {}
    for cls in config.fleet.classes.values() if config.fleet is not None else ():
        for profile, n in cls.reservable.items():
            out[profile] = out.get(profile, 0) + n
    return out


class Reservations:
    def __init__(
        self,
        store: Store,
        cache: HostCache,
        *,
        labs: Mapping[str, frozenset[str]],
        managers: Mapping[str, frozenset[str]],
        fleet_slices: Mapping[str, int],
        audit: Callable[[], Audit],
    ) -> None:
        self.store = store
        self.cache = cache
        self.labs = labs
        self.managers = managers  # lab -> the users who may reserve for it
        self.fleet_slices = fleet_slices  # profile -> the most slices the fleet classes may add
        self._audit = audit
        # Hosts of an elastic class (its ``reservable`` counts them already; the process sets it).
        self.classed: Callable[[], set[str]] = set
        # The occurrence under way filled in (holding.py's ``state``; the process sets it).
        self.shown: Callable[[ReservationView], ReservationView] = lambda view: view

    # -- reading ------------------------------------------------------------------------------------

    def all(self) -> list[Reservation]:
        return [Reservation.model_validate_json(body) for body in self.store.reservation_bodies()]

    def get(self, name: str) -> Reservation | None:
        return next((r for r in self.all() if r.name == name), None)

    def capacity(self, profile: str) -> tuple[int, str]:
        """The slices of ``profile`` the institution can hold, and how that was counted."""
        classed = self.classed()
        hosts = sum(
            1
            for v in self.cache.views()
            if v.name not in classed
            for s in v.slices
            if s.slice.kind == "mig" and s.slice.profile == profile
        )
        fleet = self.fleet_slices.get(profile, 0)
        how = f"{hosts} on the hosts" + (f" plus {fleet} the fleet classes may add" if fleet else "")
        return hosts + fleet, how

    # -- the requests -------------------------------------------------------------------------------

    def reserve(self, c: Caller, args: ReserveArgs) -> dict[str, Any]:
        lab = self._may_reserve(c, args.lab, args.group)
        try:
            grp.getgrnam(args.group)
        except KeyError:
            raise UsageError(
                f"no Unix group {args.group} on the broker's host; its members are who may use it"
            ) from None
        now = datetime.now(timezone.utc)
        start = parse_at(args.at, now)
        if start <= now:
            raise UsageError(f"--at {args.at!r} is {start.isoformat()}, already past on the broker's clock")
        until = parse_until(args.until) if args.until is not None else None
        if until is not None and until < start:
            raise UsageError(f"--until {args.until} is before the first occurrence ({start.isoformat()})")
        res = Reservation(
            name=args.name,
            group=args.group,
            lab=lab,
            profile=args.profile,
            count=args.count,
            start=start,
            duration_s=positive_seconds(args.duration, "--for"),
            weekly=args.weekly,
            until=until,
            release_unused_after_s=(
                positive_seconds(args.release_unused_after, "--release-unused-after")
                if args.release_unused_after is not None
                else None
            ),
            created_by=c.user,
            created_at=now,
        )
        if res.release_unused_after_s is not None and res.release_unused_after_s >= res.duration_s:
            raise UsageError("--release-unused-after must be shorter than --for (slices go back inside the window)")
        self._fits(res)
        if not self.store.add_reservation(res.name, res.model_dump_json(), now.timestamp()):
            raise RefusedError(f"a reservation named {res.name} exists; cancel it first or choose another name")
        self._audit()(
            "reserved",
            name=res.name,
            by=c.user,
            uid=c.uid,
            group=res.group,
            lab=res.lab,
            profile=res.profile,
            count=res.count,
            start=res.start.isoformat(),
            duration_s=res.duration_s,
            weekly=res.weekly,
            until=res.until.isoformat() if res.until else None,
        )
        return self.view(res, now).model_dump(mode="json")

    def list(self, c: Caller, args: ReservationsArgs) -> list[dict[str, Any]]:
        now = datetime.now(timezone.utc)
        found = [r for r in self.all() if args.name in (None, r.name)]
        if args.name is not None and not found:
            raise UsageError(f"no reservation {args.name}; `calque session reservations` lists them")
        views = [self.view(r, now) for r in found]
        if args.since is not None:  # calque report: each occurrence started since then, as it was used
            since = now - timedelta(seconds=positive_seconds(args.since, "since"))
            views = [v.model_copy(update={"past": self.used_since(v.reservation, since, now)}) for v in views]
        return [v.model_dump(mode="json") for v in views]

    def cancel(self, c: Caller, args: UnreserveArgs) -> dict[str, Any]:
        res = self.get(args.name)
        if res is None:
            raise UsageError(f"no reservation {args.name}; `calque session reservations` lists them")
        if not (c.admin or c.user == res.created_by or c.user in self.managers.get(res.lab, frozenset())):
            raise RefusedError(
                f"reservation {res.name} is lab {res.lab}'s: only its managers, whoever made it, root and the "
                "admin group may cancel it"
            )
        self.store.drop_reservation(res.name)
        self._audit()("unreserved", name=res.name, by=c.user, uid=c.uid, lab=res.lab)
        return {"name": res.name, "cancelled": True}

    def view(self, res: Reservation, now: datetime) -> ReservationView:
        """A reservation with its occurrences still to end (``holding.py`` fills in the one under way)."""
        return self.shown(ReservationView(reservation=res, occurrences=res.occurrences(now)))

    def used_since(self, res: Reservation, since: datetime, now: datetime) -> builtins.list[OccurrenceUse]:
        """Each occurrence of ``res`` under way since ``since`` and started by ``now``: its members'
        grants under it (the broker's rows, kept for its fair-share window), the hours they held
        their slices within it, and the reserved slices unused at the release moment (handed back)."""
        out = []
        for begin, end in res.occurrences(since):
            if begin > now:
                break
            t0, t1, t = begin.timestamp(), end.timestamp(), now.timestamp()
            rows = self.store.granted_under(res.name, t0, t1)
            held = sum(
                max(0.0, min(r.ends_at if r.ends_at is not None else t, t1, t) - (r.granted_at or t0)) for r in rows
            )
            back = 0
            if res.release_unused_after_s is not None and t >= t0 + res.release_unused_after_s:
                # From the release on, every reserved slice no member holds is the queue's: the most at
                # once is the count less the fewest members' sessions live (at the release, or as one ends).
                stop = min(t, t1)
                moments = [t0 + res.release_unused_after_s]
                moments += [r.ends_at for r in rows if r.ends_at is not None and moments[0] <= r.ends_at < stop]
                fewest = min(sum(1 for r in rows if _live(r, at)) for at in moments)
                back = max(0, res.count - fewest)
            use = OccurrenceUse(
                name=res.name, lab=res.lab, profile=res.profile, start=begin, end=end, reserved=res.count,
                sessions=len(rows), slice_hours=held / 3600.0, handed_back=back,
            )  # fmt: skip
            out.append(use)
        return out

    # -- the rules ----------------------------------------------------------------------------------

    def _may_reserve(self, c: Caller, asked: str | None, group: str) -> str:
        """The lab charged, once ``c`` may reserve for it."""
        managed = [lab for lab, users in self.managers.items() if c.user in users]
        if asked is not None and asked not in self.labs and asked != "default":
            raise UsageError(f"no lab {asked}; labs: {', '.join(self.labs) or 'none'}")
        if c.admin:
            lab = asked or lab_of(frozenset({group}), self.labs)
        elif not managed:
            raise RefusedError(
                "only root, the admin group, or a lab's manager (institution.yaml's labs.*.managers) may reserve"
            )
        elif asked is not None and asked not in managed:
            raise RefusedError(f"you manage {', '.join(managed)}, not {asked}; reserve for a lab you manage")
        else:
            lab = asked or next((m for m in managed if group in self.labs.get(m, ())), managed[0])
        # The hosts bill a member's session to a lab only when the member is in one of its groups.
        if lab != "default" and group not in self.labs.get(lab, frozenset()):
            raise RefusedError(f"group {group} is not one of lab {lab}'s groups; add it there in institution.yaml")
        return lab

    def _fits(self, res: Reservation) -> None:
        """Refused, with the reason, when the institution cannot carry ``res`` at one of its occurrences."""
        have, how = self.capacity(res.profile)
        if res.count > have:
            raise RefusedError(
                f"reservation {res.name} asks {res.count} slices of {res.profile}; the institution holds {have} ({how})"
            )
        spans = [
            (b, e, other.count)
            for other in self.all()
            if other.profile == res.profile and other.name != res.name
            for b, e in other.occurrences(res.start)
        ]
        for begin, end in res.occurrences():
            others = peak(spans, (begin, end))
            if others + res.count > have:
                clash = sorted({o.name for o in self.all() if o.profile == res.profile and o.name != res.name
                                and any(b < end and e > begin for b, e in o.occurrences(begin))})  # fmt: skip
                raise RefusedError(
                    f"reservation {res.name} asks {res.count} slices of {res.profile} on {begin.isoformat()} "
                    f"({format_duration(res.duration_s)}), when {', '.join(clash)} already hold {others} of the "
                    f"institution's {have} ({how})"
                )
