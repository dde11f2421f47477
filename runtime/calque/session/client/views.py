"""What ``calque session status`` and ``list`` print from: the daemon's answers read without pydantic.

The contracts are ``Session``, ``Slice``, ``SliceState`` and ``Drain`` in ``calque.models.session``. Importing
pydantic and building those models is most of what a researcher's two most frequent commands cost
(about two thirds of their start-up; bench/cli_startup.py), so their human output reads the same
answers into these frozen dataclasses instead: the same fields, read at least as strictly (an unknown
field, a missing one without a default, a value of the wrong type: the answer is refused; so is a
string of digits for an integer, which the model's lax mode would read; ``calque.models.view_reader``).
tests/unit/test_session_views.py
holds each view to its model, field by field and value by value, so the two cannot drift. Everything
else (checkout's rules, ``--json``) uses the models.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from calque.durations import format_duration
from calque.errors import InfrastructureError
from calque.models.view_reader import READERS, ViewError, read_view
from calque.timefmt import utc_text


@dataclasses.dataclass(frozen=True, slots=True)
class SliceView:
    id: str
    kind: str
    gpu_index: int
    gpu_uuid: str
    profile: str
    mig_uuid: str | None = None
    gpu_minor: int | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    memory_mib: int = 0
    slot: int | None = None
    active_thread_percentage: int | None = None
    pinned_mem_limit_mib: int | None = None
    pipe_directory: str | None = None
    log_directory: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class SessionView:
    id: str
    slice_id: str
    kind: str
    profile: str
    gpu_index: int
    uid: int
    gid: int
    user: str
    created_at: datetime
    expires_at: datetime
    version: int = 1
    notice_sent: bool = False
    ended_at: datetime | None = None
    end_reason: str | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    spot: bool = False
    warnings: list[str] = dataclasses.field(default_factory=list)
    active_at: datetime | None = None
    idle_ends_at: datetime | None = None
    idle_exempt: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class DrainView:
    reason: str
    by_user: str
    by_uid: int
    since: datetime
    gpu: int | None = None
    deadline: datetime | None = None

    def describe(self) -> str:  # as ``Drain.describe`` says it
        where = "this host" if self.gpu is None else f"GPU {self.gpu}"
        until = f"; live sessions there end by {utc_text(self.deadline)}" if self.deadline else ""
        return f"{where} is drained by {self.by_user} since {utc_text(self.since)}: {self.reason}{until}"


@dataclasses.dataclass(frozen=True, slots=True)
class SliceStateView:
    slice: SliceView
    busy: bool
    busy_until: datetime | None = None
    holder: str | None = None
    holder_uid: int | None = None
    session_id: str | None = None
    why_not: str | None = None
    unavailable: bool = False
    drained: DrainView | None = None


V = TypeVar("V")

_READERS: dict[str, Callable[[Any], Any]] = {
    **READERS,
    "SliceView": lambda v: read_view(SliceView, v, _READERS),
    "DrainView": lambda v: read_view(DrainView, v, _READERS),
}


def _many(cls: type[V], result: Any, what: str) -> list[V]:
    try:
        if not isinstance(result, list):
            raise ViewError("not a list")
        return [read_view(cls, item, _READERS) for item in result]
    except ViewError as exc:
        raise InfrastructureError(f"the session daemon sent {what} this client cannot read: {exc}") from None


def sessions(result: Any) -> list[SessionView]:
    """The answer to ``status``."""
    return _many(SessionView, result, "a session list")


def slice_states(result: Any) -> list[SliceStateView]:
    """The answer to ``list``."""
    return _many(SliceStateView, result, "a slice list")


def human_left(until: datetime, now: datetime) -> str:
    secs = int(max(0.0, (until - now).total_seconds()))
    return format_duration(secs - secs % 60 if secs >= 3600 else secs)  # seconds only matter in the last hour
