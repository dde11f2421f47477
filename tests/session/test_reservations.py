"""Class reservations (issue 38) in a real broker over real session daemons, with real second Unix
users: made by a lab's manager, listed, exported as iCalendar, refused to anyone else and beyond
what the institution holds, audited, and kept across ``kill -9`` of the broker."""

from __future__ import annotations

import itertools
import json
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from .conftest import User
from .institution import Broker, institution


@dataclass
class Course:
    broker: Broker
    manager: User
    students: list[User]
    researcher: User
    outsider: User
    group: str


@contextmanager
def course(make_user: Callable[..., User], slices: dict[str, int], students: int = 3) -> Iterator[Course]:
    """Hosts of 1g.5gb slices; lab ``teaching`` (its group's members, its manager) and lab ``research``
    (a share four times larger); the broker started."""
    group, research = "cqst" + secrets.token_hex(3), "cqrs" + secrets.token_hex(3)
    manager = make_user()
    members = [make_user([group]) for _ in range(students)]
    researcher, outsider = make_user([research]), make_user()
    with institution(make_user, slices) as b:
        b.write_institution(
            labs=[
                {"name": "teaching", "groups": [group], "managers": [manager.name]},
                {"name": "research", "groups": [research], "share": 4},
            ]
        )
        b.config["poll_every"] = 0.5
        b.config["queue"] = {"max_queued_per_user": 20, "claim_window": "5s", "usage_every": 0.5}
        b.start()
        yield Course(b, manager, members, researcher, outsider, group)


def reserve(c: Course, user: User | None, name: str, count: int, at: datetime, *extra: str) -> Any:
    return c.broker.cli(
        user, "session", "reserve", "--name", name, "--group", c.group, "--profile", "1g.5gb",
        "--count", str(count), "--at", at.astimezone().isoformat(), *extra,
    )  # fmt: skip


def listed(b: Broker, *args: str) -> list[dict[str, Any]]:
    res = b.cli(None, "session", "reservations", "--json", *args)
    assert res.returncode == 0, res.stderr
    out: list[dict[str, Any]] = json.loads(res.stdout)
    return out


def audit(b: Broker) -> list[dict[str, Any]]:
    path = b.dir / "audit/broker-audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def ics_events(text: str) -> list[dict[str, str]]:
    """RFC 5545's structure, checked with the standard library: CRLF lines of at most 75 octets,
    unfolded; one VCALENDAR with VERSION 2.0 and a PRODID; VEVENTs each with UID, DTSTAMP, DTSTART
    (before DTEND) in UTC."""
    assert text.endswith("\r\n") and "\n" not in text.replace("\r\n", "")
    raw = text.split("\r\n")[:-1]
    assert all(len(line.encode()) <= 75 for line in raw)
    lines: list[str] = []
    for line in raw:
        if line.startswith(" "):
            lines[-1] += line[1:]
        else:
            lines.append(line)
    assert lines[0] == "BEGIN:VCALENDAR" and lines[-1] == "END:VCALENDAR"
    assert "VERSION:2.0" in lines and any(x.startswith("PRODID:") for x in lines)
    events: list[dict[str, str]] = []
    for line in lines[1:-1]:
        if line == "BEGIN:VEVENT":
            events.append({})
        elif line != "END:VEVENT" and events and ":" in line:
            key, _, value = line.partition(":")
            events[-1][key] = value
    for e in events:
        assert {"UID", "DTSTAMP", "DTSTART", "DTEND", "SUMMARY"} <= set(e), e
        start, end = (datetime.strptime(e[k], "%Y%m%dT%H%M%SZ") for k in ("DTSTART", "DTEND"))
        assert start < end
    assert len({e["UID"] for e in events}) == len(events)
    return events


def test_a_weekly_reservation_is_made_listed_exported_refused_to_others_and_kept_across_kill_9(
    make_user: Callable[..., User], tmp_path: Path
) -> None:
    with course(make_user, {"hostA": 2, "hostB": 2}) as c:
        b = c.broker
        first = datetime.now(timezone.utc) + timedelta(days=1)
        until = (first + timedelta(weeks=3)).astimezone().date().isoformat()
        made = reserve(c, c.manager, "cs4xx-lab", 3, first, "--for", "2h", "--weekly", "--until", until,
                       "--release-unused-after", "15m", "--json")  # fmt: skip
        assert made.returncode == 0, made.stderr
        view = json.loads(made.stdout)
        r = view["reservation"]
        assert (r["name"], r["lab"], r["count"], r["created_by"]) == ("cs4xx-lab", "teaching", 3, c.manager.name)
        assert len(view["occurrences"]) == 4  # this week's day and the three after, until that day
        starts = [datetime.fromisoformat(b) for b, _ in view["occurrences"]]
        assert all(later - earlier in (timedelta(days=7), timedelta(days=7, hours=1), timedelta(days=7, hours=-1))
                   for earlier, later in itertools.pairwise(starts))  # fmt: skip

        # Anyone lists it; the table names it; the .ics has one event per occurrence.
        assert [v["reservation"]["name"] for v in listed(b)] == ["cs4xx-lab"]
        table = b.cli(c.outsider, "session", "reservations")
        assert table.returncode == 0 and "cs4xx-lab" in table.stdout and "3 x 1g.5gb" in table.stdout, table
        ics = tmp_path / "cs4xx.ics"
        exported = b.cli(None, "session", "reservations", "cs4xx-lab", "--ics", str(ics))
        assert exported.returncode == 0, exported.stderr
        events = ics_events(ics.read_bytes().decode())
        assert [datetime.strptime(e["DTSTART"], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc) for e in events] == [
            s.astimezone(timezone.utc).replace(microsecond=0) for s in starts
        ]
        assert "--reservation cs4xx-lab" in "".join(e["DESCRIPTION"] for e in events).replace("\\", "")

        # Nobody else reserves: a user who manages no lab, refused (exit 4) with who may.
        other = reserve(c, c.outsider, "mine", 1, first, "--for", "1h")
        assert other.returncode == 4 and "manager" in other.stderr, other.stderr
        # More than the hosts hold (4 slices of 1g.5gb): refused with the count.
        over = reserve(c, None, "big", 5, first, "--for", "1h")
        assert over.returncode == 4 and "asks 5 slices of 1g.5gb; the institution holds 4" in over.stderr, over.stderr
        # Overlapping the weekly one beyond capacity (3 + 2 > 4), in its third week: refused naming it.
        third = starts[2] + timedelta(minutes=30)
        clash = reserve(c, None, "exam", 2, third, "--for", "1h")
        assert clash.returncode == 4 and "cs4xx-lab already hold 3 of the institution's 4" in clash.stderr, clash
        # One that fits beside it is made (3 + 1 = 4), by root.
        assert reserve(c, None, "exam", 1, third, "--for", "1h").returncode == 0
        # Bad input: a clear error, nothing kept.
        bad = reserve(c, c.manager, "x", 1, first, "--for", "nope")
        assert bad.returncode == 2 and "--for" in bad.stderr, bad.stderr
        bad_at = b.cli(c.manager, "session", "reserve", "--name", "y", "--group", c.group, "--profile", "1g.5gb",
                       "--count", "1", "--at", "someday", "--for", "1h")  # fmt: skip
        assert bad_at.returncode == 2 and "tue 14:00" in bad_at.stderr, bad_at.stderr
        assert sorted(v["reservation"]["name"] for v in listed(b)) == ["cs4xx-lab", "exam"]

        # kill -9: both reservations are in the file, as they were.
        b.kill9()
        b.start()
        after = {v["reservation"]["name"]: v for v in listed(b)}
        assert after["cs4xx-lab"]["reservation"] == r and set(after) == {"cs4xx-lab", "exam"}

        # The outsider cannot cancel it; its manager can. Every change is in the audit trail.
        no = b.cli(c.outsider, "session", "reservations", "--cancel", "cs4xx-lab")
        assert no.returncode == 4, no.stderr
        assert b.cli(c.manager, "session", "reservations", "--cancel", "cs4xx-lab").returncode == 0
        assert [v["reservation"]["name"] for v in listed(b)] == ["exam"]
        trail = [(e["event"], e["name"], e["by"]) for e in audit(b) if e["event"] in ("reserved", "unreserved")]
        assert trail == [
            ("reserved", "cs4xx-lab", c.manager.name),
            ("reserved", "exam", "root"),
            ("unreserved", "cs4xx-lab", c.manager.name),
        ]
