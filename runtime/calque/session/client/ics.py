"""Reservations as an iCalendar file (RFC 5545) for a course page: one VEVENT per occurrence, in UTC,
lines ended by CRLF and folded at 75 octets, text values escaped."""

from __future__ import annotations

from datetime import datetime, timezone

from calque.durations import format_duration
from calque.models.reservation import ReservationView

PRODID = "-//calque//class reservations//EN"


def _utc(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _text(value: str) -> str:
    return value.replace("\\", "\\\\").replace(";", "\\;").replace(",", "\\,").replace("\n", "\\n")


def _fold(line: str) -> list[str]:
    """One content line as RFC 5545 lines of at most 75 octets (continuations start with a space)."""
    raw = line.encode()
    out: list[str] = []
    while len(raw) > 75:
        cut = 75 if not out else 74
        while cut > 0 and (raw[cut] & 0xC0) == 0x80:  # never inside a UTF-8 character
            cut -= 1
        out.append(raw[:cut].decode())
        raw = raw[cut:]
    out.append(raw.decode())
    return [out[0], *(" " + part for part in out[1:])]


def calendar(views: list[ReservationView], now: datetime, host: str = "calque") -> str:
    lines = ["BEGIN:VCALENDAR", "VERSION:2.0", f"PRODID:{PRODID}", "CALSCALE:GREGORIAN", "METHOD:PUBLISH"]
    for v in views:
        r = v.reservation
        release = (
            f"; unused slices go back to the queue {format_duration(r.release_unused_after_s)} into it"
            if r.release_unused_after_s
            else ""
        )
        for begin, end in v.occurrences:
            lines += [
                "BEGIN:VEVENT",
                f"UID:{r.name}-{_utc(begin)}@{host}",
                f"DTSTAMP:{_utc(now)}",
                f"DTSTART:{_utc(begin)}",
                f"DTEND:{_utc(end)}",
                f"SUMMARY:{_text(f'{r.name}: {r.count} GPU slices ({r.profile}) reserved')}",
                "DESCRIPTION:"
                + _text(
                    f"{r.count} slices of {r.profile} held for group {r.group}: check out with "
                    f"`calque session checkout --anywhere --profile {r.profile} --reservation {r.name}`{release}"
                ),
                "END:VEVENT",
            ]
    lines.append("END:VCALENDAR")
    return "".join(part + "\r\n" for line in lines for part in _fold(line))
