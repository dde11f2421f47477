"""Class reservations (issue 38): a course books N slices of one profile for its Unix group at fixed
times, once or weekly, and the broker holds them for it (``calque.session.broker.reservations``).

Times are the broker's: ``at`` is read on the broker, in its local time zone ("tue 14:00", "14:00",
or an ISO time; one with an offset is taken as written). A weekly reservation's occurrences keep
their local wall-clock time across a daylight-saving change.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StrictBool, StrictStr, model_validator

from calque.models.base import CalqueModel, Duration, positive_seconds
from calque.models.institution import UserName

_DEFERRED = ConfigDict(defer_build=True)
ReservationName = Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
MAX_OCCURRENCES = 520  # ten years of a weekly class: a bound on what is checked and exported
WEEK = timedelta(days=7)


class ReserveArgs(CalqueModel):
    """``calque session reserve``: what the client sends; the broker reads ``at`` on its own clock."""

    model_config = _DEFERRED
    name: ReservationName
    group: UserName
    profile: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    count: int = Field(ge=1, le=100_000)
    at: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    duration: Duration = Field(description="how long each occurrence lasts (--for)")
    weekly: StrictBool = False
    until: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = None
    release_unused_after: Duration | None = None
    lab: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = Field(
        None, description="the lab charged (default: the manager's lab, or the group's lab for an admin)"
    )

    @model_validator(mode="after")
    def _checked(self) -> ReserveArgs:
        positive_seconds(self.duration, "--for")
        if self.release_unused_after is not None:
            positive_seconds(self.release_unused_after, "--release-unused-after")
        if self.until is not None and not self.weekly:
            raise ValueError("--until needs --weekly (a single occurrence ends with its window)")
        return self


class ReservationsArgs(CalqueModel):
    model_config = _DEFERRED
    name: ReservationName | None = None
    since: Duration | None = Field(
        None, description="also each occurrence that started this far back: what it was used for (calque report)"
    )


class UnreserveArgs(CalqueModel):
    model_config = _DEFERRED
    name: ReservationName


class Reservation(CalqueModel):
    """One reservation as the broker keeps it (one JSON body per row of its ``reservations`` table)."""

    model_config = _DEFERRED
    name: ReservationName
    group: UserName
    lab: str
    kind: Literal["mig"] = "mig"
    profile: str
    count: int = Field(ge=1)
    start: datetime = Field(description="the first occurrence's start")
    duration_s: float = Field(gt=0)
    weekly: bool = False
    until: datetime | None = Field(None, description="no weekly occurrence starts after this")
    release_unused_after_s: float | None = None
    created_by: str
    created_at: datetime

    def occurrences(self, since: datetime | None = None) -> list[tuple[datetime, datetime]]:
        """Each occurrence's (start, end), those ending after ``since``, at most ``MAX_OCCURRENCES``."""
        span = timedelta(seconds=self.duration_s)
        wall = self.start.astimezone().replace(tzinfo=None)  # the broker's local wall time
        out: list[tuple[datetime, datetime]] = []
        for k in range(MAX_OCCURRENCES if self.weekly else 1):
            begin = (wall + k * WEEK).astimezone() if k else self.start
            if self.until is not None and begin > self.until:
                break
            if since is None or begin + span > since:
                out.append((begin, begin + span))
        return out

    def at(self, now: datetime) -> tuple[datetime, datetime] | None:
        """The occurrence under way at ``now``, if any."""
        return next(((b, e) for b, e in self.occurrences(now) if b <= now < e), None)


class OccurrenceState(CalqueModel):
    """The occurrence under way: what is reserved, used by members, still held, and handed back."""

    model_config = _DEFERRED
    start: datetime
    end: datetime
    reserved: int
    used: int
    held: int
    handed_back: int
    short: int = Field(0, description="reserved slices the institution could not hold (sessions ran into it)")


class OccurrenceUse(CalqueModel):
    """One occurrence that has started, as ``calque report`` shows it: the reserving lab's, what its
    members used under it, and what went back to the queue."""

    model_config = _DEFERRED
    name: str
    lab: str
    profile: str
    start: datetime
    end: datetime
    reserved: int
    sessions: int = Field(description="members' checkouts granted under it")
    slice_hours: float = Field(description="hours those sessions held their slices within the window, up to now")
    handed_back: int = Field(
        description="reserved slices unused at --release-unused-after, handed back to the queue (0 before then)"
    )


class ReservationView(CalqueModel):
    """``calque session reservations``: a reservation and its upcoming occurrences."""

    model_config = _DEFERRED
    reservation: Reservation
    occurrences: list[tuple[datetime, datetime]]
    now: OccurrenceState | None = None
    past: list[OccurrenceUse] = Field(default_factory=list, description="with ``since``: each occurrence started")
