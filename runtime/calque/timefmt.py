"""Times as calque shows them to people: always UTC, one spelling per precision, written in one place."""

from __future__ import annotations

from datetime import datetime, timezone

STAMP = "%Y-%m-%d %H:%M:%SZ"  # a whole moment: audit lines, queue rows, drain deadlines
CLOCK = "%H:%M:%SZ"  # a moment within the day a person is looking at: a session's end
MINUTE = "%Y-%m-%d %H:%M UTC"  # the edges of a window of history (calque gpu mig suggest)


def utc_moment(t: float) -> datetime:
    """A Unix time as an aware UTC datetime: how SQLite rows, ledger events and usage records become models."""
    return datetime.fromtimestamp(t, tz=timezone.utc)


def utc_text(when: datetime | float | None, fmt: str = STAMP, *, none: str = "") -> str:
    """``when`` (an aware datetime or a Unix time) in UTC as ``fmt``; ``none`` when there is no time."""
    if when is None:
        return none
    moment = when if isinstance(when, datetime) else utc_moment(when)
    return moment.astimezone(timezone.utc).strftime(fmt)
