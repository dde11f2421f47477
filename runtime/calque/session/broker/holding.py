"""How reservations hold slices (issue 38, parts 2 and 4), on the broker's clock.

Ahead of an occurrence, a grant to anyone else whose TTL runs into it is capped at its start (with
the reason) when the slices of its profile free then would otherwise be fewer than it reserves;
sessions already running into it are never cut, so an occurrence may start short. During an
occurrence, its unused slices (reserved minus those its members hold) are held: the rest of the
queue gets only the free slices beyond them, until ``release_unused_after`` into it, when what is
still unused goes back to the queue for the rest of that occurrence. A member of its group checks
out under it (``--reservation NAME``, or by itself): ahead of the queue, billed to the reserving lab
(not the member's own lab's fair share), and ending by the window's end at the latest.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

from calque.errors import RefusedError, UsageError
from calque.models.reservation import OccurrenceState, Reservation, ReservationView
from calque.models.session import SliceState
from calque.session.broker.hosts import HostCache, offered
from calque.session.broker.reservations import Reservations
from calque.session.broker.store import Store
from calque.timefmt import CLOCK, utc_text

MIN_TTL_S = 1.0  # a grant capped shorter than this would be over before it is used: the slice is held instead
# A session capped at a start ends a moment after it (its host counts the TTL from its own checkout):
# one ending within this of a start counts as ending there, not as running into the occurrence.
CAP_SLACK_S = 5.0


@dataclass(frozen=True)
class Under:
    """A member's checkout under an occurrence: the TTL it gets and why."""

    reservation: Reservation
    lab: str
    profile: str
    ttl: float
    note: str


def _ts(t: datetime) -> float:
    return t.timestamp()


class Holding:
    def __init__(self, store: Store, cache: HostCache, book: Reservations, *, assumed_ttl: float) -> None:
        self.store = store
        self.cache = cache
        self.book = book
        self.assumed_ttl = assumed_ttl

    # -- members ------------------------------------------------------------------------------------

    def member(self, groups: frozenset[str], asked: str | None, profile: str | None, ttl: float | None) -> Under | None:
        """The reservation a checkout of a member of ``groups`` is made under: ``asked`` (refused when
        it is not theirs, not under way, or every slice of it is in use), or the one under way for a
        group of theirs with a slice unused."""
        now = datetime.now(timezone.utc)
        if asked is not None:
            res = self.book.get(asked)
            if res is None:
                raise UsageError(f"no reservation {asked}; `calque session reservations` lists them")
            if res.group not in groups:
                raise RefusedError(f"reservation {asked} is for members of group {res.group}; you are not one")
            if profile not in (None, res.profile):
                raise UsageError(f"reservation {asked} holds {res.profile} slices; leave out --profile or ask that one")
            window = res.at(now)
            if window is None:
                nxt = res.occurrences(now)
                when = f"its next starts {utc_text(nxt[0][0], CLOCK)}" if nxt else "it has no occurrence left"
                raise RefusedError(f"reservation {asked} is not under way now; {when}")
            if self.used(res, window[0]) >= res.count:
                raise RefusedError(
                    f"all {res.count} slices of reservation {asked} are in use; try again when one is back"
                )
            return self._under(res, window, ttl, now)
        for res in self.book.all():
            window = res.at(now)
            if (
                window is not None
                and res.group in groups
                and profile in (None, res.profile)
                and self.used(res, window[0]) < res.count
            ):
                return self._under(res, window, ttl, now)
        return None

    def _under(self, res: Reservation, window: tuple[datetime, datetime], ttl: float | None, now: datetime) -> Under:
        left = (window[1] - now).total_seconds()
        asked = ttl if ttl is not None else self.assumed_ttl
        note = f"under reservation {res.name}" + (
            f": it ends with the window at {utc_text(window[1], CLOCK)}" if asked > left else ""
        )
        return Under(res, res.lab, res.profile, min(asked, left), note)

    def left(self, name: str, now: float) -> float | None:
        """Seconds left in reservation ``name``'s occurrence under way; None when none is."""
        res = self.book.get(name)
        window = res.at(datetime.fromtimestamp(now, timezone.utc)) if res is not None else None
        return _ts(window[1]) - now if window is not None else None

    def used(self, res: Reservation, since: datetime) -> int:
        """The slices members hold under ``res`` since ``since`` (its occurrence's start), live now."""
        return len(self.store.under(res.name, _ts(since), _ts(datetime.now(timezone.utc))))

    # -- everyone else ------------------------------------------------------------------------------

    def held(self, profile: str, now: float) -> dict[str, int]:
        """Per reservation of ``profile`` under way and not yet handed back, its unused slices."""
        at = datetime.fromtimestamp(now, timezone.utc)
        out = {}
        for res in self.book.all():
            window = res.at(at) if res.profile == profile else None
            if window is None or self._handed_back(res, window[0], at):
                continue
            out[res.name] = max(0, res.count - self.used(res, window[0]))
        return out

    @staticmethod
    def _handed_back(res: Reservation, begin: datetime, at: datetime) -> bool:
        return res.release_unused_after_s is not None and (at - begin).total_seconds() >= res.release_unused_after_s

    def any_held(self, now: float) -> bool:
        return any(sum(self.held(p, now).values()) for p in {r.profile for r in self.book.all()})

    def spare(self, profile: str, now: float) -> int:
        """Free slices of ``profile`` beyond what reservations under way hold (may be below zero).
        The store is read before the cache, the reverse of a grant's writes (the cache's mark, then the
        store's row): a grant landing between the reads makes this too low, never too high."""
        held = sum(self.held(profile, now).values())
        free = sum(1 for v in self.cache.views() if v.reachable for s in v.slices if _is(s, profile) and offered(s))
        return free - held

    def cap(
        self, profile: str | None, ttl: float | None, now: float, after: float | None = None
    ) -> tuple[float, str] | None:
        """A TTL capped at the start of the first occurrence ahead that this grant would run into and
        leave short (fewer of its profile's slices free then than reserved), with the reason.
        ``after``: only occurrences starting then or later (a session already running into one keeps
        its slice there, extended or not)."""
        end = now + (ttl if ttl is not None else self.assumed_ttl)
        first = max(now, after) if after is not None else now
        at = datetime.fromtimestamp(now, timezone.utc)
        starts: list[tuple[float, Reservation]] = []
        for res in self.book.all():
            if profile not in (None, res.profile):
                continue
            starts += [(_ts(b), res) for b, _ in res.occurrences(at) if first <= _ts(b) < end and _ts(b) > now]
        for begin, res in sorted(starts, key=lambda x: x[0]):
            needed = sum(r.count for r in self._covering(res.profile, begin))
            if self.free_at(res.profile, begin) - 1 < needed:
                start = datetime.fromtimestamp(begin, timezone.utc)
                why = (
                    f"TTL capped at {utc_text(start, CLOCK)}: reservation {res.name} holds {res.count} "
                    f"{res.profile} slices for group {res.group} from then"
                )
                return begin - now, why
        return None

    def _covering(self, profile: str, at: float) -> Iterable[Reservation]:
        when = datetime.fromtimestamp(at, timezone.utc)
        return [r for r in self.book.all() if r.profile == profile and r.at(when) is not None]

    def free_at(self, profile: str, at: float) -> int:
        """Slices of ``profile`` that will be free at ``at``: free now, or held until before it."""
        n = 0
        for v in self.cache.views():
            for s in v.slices:
                if not v.reachable or not _is(s, profile) or s.drained is not None or s.unavailable:
                    continue
                if not s.busy or (s.busy_until is not None and s.busy_until.timestamp() <= at + CAP_SLACK_S):
                    n += 1
        return n

    def extension(self, host: str, session_id: str, by: float, now: float) -> tuple[float, str] | None:
        """``extend --by`` of a session on ``host`` capped (with why): a member's at its window's end,
        anyone else's at the start of an occurrence it would leave short. None: as asked."""
        view = self.cache.view(host)
        held = next((s for s in view.slices if s.session_id == session_id and s.busy_until is not None), None)
        if held is None or held.busy_until is None or held.slice.kind != "mig":
            return None  # not seen yet (the host decides alone) or an MPS slot
        until = held.busy_until.timestamp()
        at = datetime.fromtimestamp(now, timezone.utc)
        for res in self.book.all():
            window = res.at(at)
            if window is not None and any(
                r.session_id == session_id for r in self.store.under(res.name, _ts(window[0]), now)
            ):
                room = _ts(window[1]) - until
                return (room, f"reservation {res.name}: its sessions end with its window") if by > room else None
        cap = self.cap(held.slice.profile, until + by - now, now, after=until - CAP_SLACK_S)
        return (cap[0] - (until - now), cap[1]) if cap is not None else None

    # -- what is shown ------------------------------------------------------------------------------

    def state(self, view: ReservationView) -> ReservationView:
        """``view`` with the occurrence under way: reserved, used, held, handed back, short."""
        now = datetime.now(timezone.utc)
        res = view.reservation
        window = res.at(now)
        if window is None:
            return view
        used = self.used(res, window[0])
        unused = max(0, res.count - used)
        back = self._handed_back(res, window[0], now)
        free = self.free_at(res.profile, now.timestamp())
        state = OccurrenceState(
            start=window[0],
            end=window[1],
            reserved=res.count,
            used=used,
            held=0 if back else min(unused, free),
            handed_back=unused if back else 0,
            short=0 if back else max(0, unused - free),
        )
        return view.model_copy(update={"now": state})


def _is(s: SliceState, profile: str) -> bool:
    return s.slice.kind == "mig" and s.slice.profile == profile
