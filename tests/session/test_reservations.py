"""Class reservations (issue 38) in a real broker over real session daemons, with real second Unix
users: made by a lab's manager, listed, exported as iCalendar, refused to anyone else and beyond
what the institution holds, audited, and kept across ``kill -9`` of the broker."""

from __future__ import annotations

import itertools
import json
import secrets
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from support.waits import HANG_S

from .conftest import User, wait_for
from .institution import Broker, institution


@dataclass
class Course:
    broker: Broker
    manager: User
    students: list[User]
    researchers: list[User]
    outsider: User
    group: str

    @property
    def researcher(self) -> User:
        return self.researchers[0]


@contextmanager
def course(
    make_user: Callable[..., User], slices: dict[str, int], students: int = 3, researchers: int = 1
) -> Iterator[Course]:
    """Hosts of 1g.5gb slices billing labs by institution.yaml: ``teaching`` (its group's members, its
    manager; a share of 1/1000) and ``research`` (a share of 4); the broker started."""
    group, research = "cqst" + secrets.token_hex(3), "cqrs" + secrets.token_hex(3)
    manager = make_user()
    members = [make_user([group]) for _ in range(students)]
    others, outsider = [make_user([research]) for _ in range(researchers)], make_user()
    with institution(make_user, slices) as b:
        b.write_institution(
            labs=[
                {"name": "teaching", "groups": [group], "managers": [manager.name], "share": 0.001},
                {"name": "research", "groups": [research], "share": 4},
            ]
        )
        (b.dir / "institution.yaml").chmod(0o644)
        for h in b.hosts.values():
            h.stop()
            h.start(institution=str(b.dir / "institution.yaml"))
        b.config["poll_every"] = 0.5
        b.config["queue"] = {"max_queued_per_user": 20, "claim_window": "5s", "usage_every": 0.5}
        b.start()
        yield Course(b, manager, members, others, outsider, group)


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


def checkout(b: Broker, user: User, *extra: str) -> Any:
    return b.cli(user, "session", "checkout", "--anywhere", "--profile", "1g.5gb", "--ttl", "1h", "--json", *extra)


def granted(p: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = p.communicate(timeout=HANG_S)
    assert p.returncode == 0, err
    grant: dict[str, Any] = json.loads(out)
    return grant


def when(text: str) -> datetime:
    return datetime.fromisoformat(text)


def billed(b: Broker, session_ids: set[str]) -> dict[str, str]:
    """The lab each of those sessions is billed to, as its host's registry recorded it."""
    out: dict[str, str] = {}
    for h in b.hosts.values():
        db = sqlite3.connect(f"file:{h.dir / 'state/sessions.db'}?mode=ro", uri=True)
        try:
            out.update({sid: lab for sid, lab in db.execute("SELECT session_id, lab FROM session_labs")})
        finally:
            db.close()
    return {sid: lab for sid, lab in out.items() if sid in session_ids}


def test_a_window_caps_long_checkouts_before_it_serves_its_members_first_and_hands_unused_slices_back(
    make_user: Callable[..., User],
) -> None:
    """4 slices; 3 reserved from S for 20 minutes (no step waits for its end: room for a loaded
    machine), unused ones handed back 18 s in. Before S: a first long checkout keeps its TTL (one
    slice is spare), a second is capped at S. From S: a researcher
    of the lab with the better fair share waits, and the 3 members (the reserving lab a thousand
    times over its share) are granted ahead of her, their sessions ending with the window; one
    member checks in, and its slice stays held until the release delay, then goes to the researcher."""
    with course(make_user, {"hostA": 2, "hostB": 2}, students=4, researchers=3) as c:
        b = c.broker
        spare_holder, capped, waiter = c.researchers
        # A member's own lab is charged for what it uses outside a window: far over its share.
        early = checkout(b, c.students[3])
        assert early.returncode == 0, early.stderr
        e = json.loads(early.stdout)
        assert b.cli(c.students[3], "session", "checkin", f"{e['session']['id']}@{e['host']}").returncode == 0

        start = datetime.now(timezone.utc) + timedelta(seconds=12)
        made = reserve(c, c.manager, "cs4xx-lab", 3, start, "--for", "20m", "--release-unused-after", "18s", "--json")
        assert made.returncode == 0, made.stderr
        start = when(json.loads(made.stdout)["occurrences"][0][0])
        end = start + timedelta(minutes=20)

        kept = checkout(b, spare_holder)
        assert kept.returncode == 0, kept.stderr
        g = json.loads(kept.stdout)
        assert g["note"] is None and when(g["session"]["expires_at"]) > start + timedelta(minutes=50)
        short = checkout(b, capped)
        assert short.returncode == 0, short.stderr
        g = json.loads(short.stdout)
        assert g["note"].startswith("TTL capped at") and "reservation cs4xx-lab" in g["note"], g
        assert abs((when(g["session"]["expires_at"]) - start).total_seconds()) < 1.5, (g["session"], start)
        # Extending it into the window through the broker: refused, saying why.
        ext = b.cli(capped, "session", "extend", f"{g['session']['id']}@{g['host']}", "--by", "1h")
        assert ext.returncode == 4 and "not extended" in ext.stderr and "cs4xx-lab" in ext.stderr, ext.stderr

        # The window opens (the broker's clock is this machine's); the capped session ends at its start.
        wait_for(lambda: datetime.now(timezone.utc) >= start)
        w = b.popen(
            waiter, "session", "checkout", "--anywhere", "--profile", "1g.5gb", "--ttl", "1h", "--wait", "--json"
        )
        wait_for(lambda: any(e["user"] == waiter.name and e["state"] == "queued" for e in b.queue_all()))
        members = [  # the first names the reservation, the others are under it by themselves; the last asks 20 s
            b.popen(m, "session", "checkout", "--anywhere", "--profile", "1g.5gb", "--wait", "--json",
                    "--ttl", "20s" if i == 2 else "1h", *(["--reservation", "cs4xx-lab"] if i == 0 else []))
            for i, m in enumerate(c.students[:3])
        ]  # fmt: skip
        grants = [granted(p) for p in members]
        all_granted = datetime.now(timezone.utc)  # the broker recorded each grant before its member read it
        assert {gr["reservation"] for gr in grants} == {"cs4xx-lab"}
        assert all(when(gr["session"]["expires_at"]) <= end + timedelta(seconds=1.5) for gr in grants), grants
        assert w.poll() is None  # still waiting: the members went first
        # A member's extension stops at the window's end: none past it, a shorter one up to it.
        m = grants[1]
        ext = b.cli(c.students[1], "session", "extend", f"{m['session']['id']}@{m['host']}", "--by", "1h")
        assert ext.returncode == 4 and "its sessions end with its window" in ext.stderr, ext.stderr
        m = grants[2]
        ext = b.cli(c.students[2], "session", "extend", f"{m['session']['id']}@{m['host']}", "--by", "1h", "--json")
        assert ext.returncode == 0 and "extended less than asked" in ext.stderr, ext.stderr
        assert end - timedelta(seconds=5) < when(json.loads(ext.stdout)["expires_at"]) <= end + timedelta(seconds=1.5)
        assert [e["state"] for e in b.queue_all() if e["user"] == waiter.name] == ["queued"]
        # Billed to the reserving lab, as the hosts recorded it.
        assert set(billed(b, {gr["session"]["id"] for gr in grants}).values()) == {"teaching"}

        # One member checks in: her slice is free, but held for the reservation until the release delay.
        first = grants[0]
        assert b.cli(c.students[0], "session", "checkin", f"{first['session']['id']}@{first['host']}").returncode == 0
        wait_for(lambda: any(
            not s["busy"] for v in json.loads(b.cli(None, "session", "list", "--all", "--json").stdout)
            for s in v["slices"]))  # fmt: skip
        now = next(v["now"] for v in listed(b) if v["reservation"]["name"] == "cs4xx-lab")
        if datetime.now(timezone.utc) < start + timedelta(seconds=18):
            assert (now["used"], now["held"], now["handed_back"]) == (2, 1, 0), now
            assert w.poll() is None and "1 held" in b.cli(None, "session", "list", "--all").stdout

        # Past the release delay the unused slice goes back to the queue: the researcher is granted.
        g = granted(w)
        assert when(g["session"]["created_at"]) >= start + timedelta(seconds=17.5), (g, start)
        assert g["reservation"] is None
        after = next(v["now"] for v in listed(b) if v["reservation"]["name"] == "cs4xx-lab")
        assert (after["used"], after["held"], after["handed_back"]) == (2, 0, 1), after
        assert "1 handed back" in b.cli(None, "session", "list", "--all").stdout

        # calque report: the members' sessions are the reserving lab's usage, and the occurrence says
        # how many of its slices the members used and how many went back to the queue.
        asked = datetime.now(timezone.utc)
        rep = b.cli(None, "report", "--institution", "--since", "1h", "--json")
        answered = datetime.now(timezone.utc)
        assert rep.returncode == 0, rep.stderr
        r = json.loads(rep.stdout)
        (occ,) = r["reservations"]
        assert (occ["name"], occ["lab"], occ["reserved"], occ["sessions"]) == ("cs4xx-lab", "teaching", 3, 3), occ
        assert occ["handed_back"] == 1 and when(occ["start"]) == start, occ
        # Slice-hours: at least the 2 members who still hold theirs, each since the broker recorded their
        # grant (before the member could read it: all_granted); at most 3 slices since the start.
        low, high = 2 * (asked - all_granted).total_seconds() / 3600, 3 * (answered - start).total_seconds() / 3600
        assert low <= occ["slice_hours"] <= high, (occ, low, high)
        labs = {row["key"]: row["gpu_hours"] for row in r["rows"]}
        assert labs.get("teaching", 0) > 0, r["rows"]
        human = b.cli(None, "report", "--institution", "--since", "1h")
        assert "reservation cs4xx-lab (teaching)" in human.stdout and "1 handed back" in human.stdout, human.stdout


def test_times_are_read_on_the_brokers_clock_and_a_long_event_folds_into_valid_ics() -> None:
    from calque.errors import UsageError
    from calque.models.reservation import Reservation, ReservationView
    from calque.session.broker.reservations import parse_at, parse_until, peak
    from calque.session.client.ics import calendar

    now = datetime(2027, 1, 12, 15, 0).astimezone()  # a Tuesday, 15:00 local
    assert parse_at("tue 14:00", now) == datetime(2027, 1, 19, 14, 0).astimezone()  # today's is past: next week
    assert parse_at("Wednesday 09:30", now) == datetime(2027, 1, 13, 9, 30).astimezone()
    assert parse_at("16:00", now) == datetime(2027, 1, 12, 16, 0).astimezone()
    assert parse_at("2027-02-01T10:00+00:00", now) == datetime(2027, 2, 1, 10, 0, tzinfo=timezone.utc)
    for bad in ("xyz 14:00", "25:00", "tomorrow"):
        try:
            parse_at(bad, now)
        except UsageError:
            continue
        raise AssertionError(f"--at {bad!r} was read")
    assert parse_until("2027-03-31") == datetime(2027, 3, 31, 23, 59, 59).astimezone()
    t = [now + timedelta(hours=h) for h in range(6)]
    # 2 over [0, 3), 1 over [1, 2), 3 over [2, 5): at most 5 at once (at 2), counted within [0, 6).
    assert peak([(t[0], t[3], 2), (t[1], t[2], 1), (t[2], t[5], 3)], (t[0], t[5])) == 5
    assert peak([(t[0], t[1], 2), (t[1], t[2], 3)], (t[0], t[2])) == 3  # one ends as the next starts

    res = Reservation(name="a" * 64, group="cs4xx-students", lab="teaching", profile="1g.24gb", count=30,
                      start=now, duration_s=7200, weekly=True, until=now + timedelta(weeks=2),
                      created_by="prof", created_at=now)  # fmt: skip
    text = calendar([ReservationView(reservation=res, occurrences=res.occurrences())], now)
    events = ics_events(text)
    assert len(events) == 3 and all(e["UID"].startswith("a" * 64) for e in events)


def test_the_fleet_class_is_raised_by_the_lead_before_a_window_and_lowered_after(moto: str, tmp_path: Path) -> None:
    """The broker's fleet thread, on moto's Auto Scaling: a class whose hosts hold 2 slices of 1g.5gb
    each, booting in 60 s, and a reservation of 3 (no fixed host holds any): 2 hosts wanted from the
    lead (2 x 60 s + one 5 s period) before the start, through the window, and given back after."""
    from calque.aws.clients import client
    from calque.models.fleet import DemandClass, DemandSettings, fleet_pool
    from calque.models.pool_names import pool_names
    from calque.models.reservation import Reservation
    from calque.session.broker.demand import FleetDemand
    from calque.session.broker.hosts import HostCache
    from calque.session.broker.reserve_capacity import reservation_lead
    from calque.session.broker.store import Store

    group = pool_names(fleet_pool("teaching")).group
    ami = client("ssm").get_parameter(Name="/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64")
    tid = client("ec2").create_launch_template(
        LaunchTemplateName="fleet-reserve", LaunchTemplateData={"ImageId": ami["Parameter"]["Value"]}
    )["LaunchTemplate"]["LaunchTemplateId"]
    asg = client("autoscaling")
    asg.create_auto_scaling_group(
        AutoScalingGroupName=group, MinSize=0, MaxSize=4, DesiredCapacity=0, AvailabilityZones=["us-east-1a"],
        LaunchTemplate={"LaunchTemplateId": tid, "Version": "1"},
    )  # fmt: skip
    cls = DemandClass(offers=["1g.5gb"], per_host={"1g.5gb": 2}, boot_s=60)
    settings = DemandSettings(
        classes={"teaching": cls}, publish_every=5, region="us-east-1", endpoint_url=moto, discover=False
    )
    store = Store(tmp_path / "broker/broker.db")
    start = datetime.now(timezone.utc) + timedelta(days=2)
    res = Reservation(name="cs4xx-lab", group="students", lab="teaching", profile="1g.5gb", count=3, start=start,
                      duration_s=7200, created_by="prof", created_at=datetime.now(timezone.utc))  # fmt: skip
    assert store.add_reservation(res.name, res.model_dump_json(), 0.0)

    def book() -> list[Reservation]:
        return [Reservation.model_validate_json(b) for b in store.reservation_bodies()]

    def no_link(reg: object) -> Any:
        raise AssertionError("no host registers in this test")

    fleet = FleetDemand(settings, store, HostCache({}), no_link, reservations=book)

    def desired_at(seconds_from_start: float) -> int:
        fleet.once(now=start.timestamp() + seconds_from_start)
        found = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"][0]
        return int(found["DesiredCapacity"])

    lead = reservation_lead(cls, 5)
    assert lead == 125
    assert desired_at(-lead - 60) == 0  # before the lead: nothing asked
    assert desired_at(-lead + 5) == 2  # from the lead: ceil(3 / 2) hosts
    assert desired_at(3600) == 2  # through the window
    assert desired_at(7200 + 1) == 0  # after it: given back
    store.close()
