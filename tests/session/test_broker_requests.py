"""Nothing the broker is asked for is lost or stranded (issue 39, part 3): a refusal another host or a
later moment could satisfy leaves the request queued; a grant on a host that never answers expires,
can be cancelled and stops counting against the user's cap, and what the host made for it meanwhile
is checked in once it answers; a queued request whose client went away is dropped; slices nobody can
have are not free. Real broker, real daemons, real users (and real munge where the hosts are over TCP).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from calque.models.broker import HostView
from calque.models.fleet import DemandClass, DemandSettings
from calque.models.session import Drain, Slice, SliceState
from calque.session.broker.demand import count_demand
from calque.session.broker.presence import Presence
from calque.session.broker.store import NewRequest, Store
from support.waits import HANG_S

from .conftest import User, wait_for
from .institution import Broker, institution, over_tcp

CONSENT = "--i-understand-shared-gpu-has-no-isolation"
WAITER = """
import json, sys
from calque.models.broker import AnywhereArgs
from calque.session.client.broker import BrokerClient
g = BrokerClient(reconnect_for=30).anywhere(AnywhereArgs(ttl="1h", wait=True, request_id=sys.argv[1]))
print(json.dumps({"request": g.request_id, "host": g.host}), flush=True)
"""


def _entries(broker: Broker, user: User) -> list[dict[str, Any]]:
    return [e for e in broker.queue_all() if e["user"] == user.name]


def _state(broker: Broker, request_id: str) -> str | None:
    return next((e["state"] for e in broker.queue_all() if e["id"] == request_id), None)


def _broker_audit(broker: Broker) -> list[dict[str, Any]]:
    path = broker.dir / "audit/broker-audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _sessions_for(broker: Broker, host: str, request_ids: set[str]) -> list[tuple[str, str, float | None]]:
    """(request id, session id, ended_at) of every session ``host``'s registry holds for those requests."""
    db = sqlite3.connect(f"file:{broker.hosts[host].dir / 'state/sessions.db'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT request_id, id, ended_at FROM sessions WHERE request_id IS NOT NULL").fetchall()
    finally:
        db.close()
    return [(r[0], r[1], r[2]) for r in rows if r[0] in request_ids]


@pytest.mark.skipif(shutil.which("munged") is None, reason="munge is not installed")
@pytest.mark.slow
def test_a_refusal_another_host_could_satisfy_leaves_the_request_queued_and_only_every_hosts_refusal_ends_it(
    make_user: Callable[..., User],
) -> None:
    """hostA allows sessions of 1 h at most, hostB of 8 h; both reached over TCP with munge."""
    with institution(make_user, {"hostA": 2, "hostB": 1}) as broker:
        broker.hosts["hostA"].config["policy"] = {"default": {"max_sessions": 100, "max_ttl": "1h"}}
        with over_tcp(broker):
            broker.start()
            alice, carol, dave = make_user(), make_user(), make_user()
            # A direct --anywhere asks the emptiest host first (hostA: 2 free), which refuses 2 h; it
            # goes on to hostB instead of ending there.
            res = broker.cli(alice, "session", "checkout", "--anywhere", "--ttl", "2h", "--json")
            assert res.returncode == 0, res.stderr
            first = json.loads(res.stdout)
            assert first["host"] == "hostB", first

            # hostB busy, hostA refuses: carol's request waits for hostB instead of ending.
            waiter = broker.popen(carol, "session", "checkout", "--anywhere", "--ttl", "2h", "--wait", "--json")
            assert wait_for(lambda: [e["state"] for e in _entries(broker, carol)] == ["queued"])
            assert waiter.poll() is None, waiter.communicate()
            ref = f"{first['session']['id']}@hostB"
            assert broker.cli(alice, "session", "checkin", ref).returncode == 0
            out, err = waiter.communicate(timeout=HANG_S)
            assert waiter.returncode == 0, err
            got = json.loads(out)
            assert got["host"] == "hostB" and got["session"]["user"] == carol.name
            assert broker.cli(carol, "session", "checkin", f"{got['session']['id']}@hostB").returncode == 0

            # 10 h is over every host's maximum: the waiting request ends at once, with each host's words.
            res = broker.cli(dave, "session", "checkout", "--anywhere", "--ttl", "10h", "--wait")
            assert res.returncode == 4, res.stderr
            assert "refused by every host that offers it" in res.stderr, res.stderr
            assert "hostA: --ttl 36000 s is more than your limit of 3600 s" in res.stderr, res.stderr
            assert "hostB: --ttl 36000 s is more than your limit of 28800 s" in res.stderr, res.stderr
            assert not [e for e in _entries(broker, dave) if e["state"] == "queued"]


@pytest.mark.slow
def test_an_mps_host_whose_daemon_is_down_is_no_free_slot_and_its_refusal_leaves_a_waiter_queued(
    make_user: Callable[..., User],
) -> None:
    with institution(make_user, {"mpsA": -1, "mpsB": -1}) as broker:
        broker.config["poll_every"] = 3600  # the broker's first look saw mpsA's slot free: it is stale
        broker.start()
        bob, alice, carol = make_user(), make_user(), make_user()
        mps_a = broker.hosts["mpsA"]
        mps_a.kill_mps(0)

        def down_there() -> bool:  # mpsA itself has noticed (it probes its daemon at most once a second)
            listed = json.loads(mps_a.cli(None, "session", "list", "--json", check=True).stdout)
            return [st["unavailable"] for st in listed] == [True]

        assert wait_for(down_there)
        mps = ("--mps", CONSENT)
        # mpsA comes first by name of two equally empty hosts, but offers nothing now: tried and refused
        # (the broker's cache still had it free), or skipped (a nudge showed it unavailable first).
        held = broker.anywhere(bob, *mps)
        assert held["host"] == "mpsB", held

        def states() -> dict[str, str]:
            res = broker.cli(carol, "session", "list", "--all")
            rows = [line.split() for line in res.stdout.splitlines() if line.startswith("mps")]
            return {r[0]: r[4] for r in rows}

        assert wait_for(lambda: states() == {"mpsA": "unavailable", "mpsB": "busy"}), states()
        busy = broker.cli(carol, "session", "checkout", "--anywhere", "--ttl", "1h", *mps)
        assert busy.returncode == 5, busy.stderr
        assert "busy or unavailable" in busy.stderr and "mpsA: not offered:" in busy.stderr, busy.stderr

        waiter = broker.popen(alice, "session", "checkout", "--anywhere", "--ttl", "1h", *mps, "--wait", "--json")
        assert wait_for(lambda: [e["state"] for e in _entries(broker, alice)] == ["queued"])
        assert broker.hosts["mpsB"].cli(bob, "session", "checkin", held["session"]["id"]).returncode == 0
        out, err = waiter.communicate(timeout=HANG_S)
        assert waiter.returncode == 0, err
        assert json.loads(out)["host"] == "mpsB"


@pytest.mark.slow
def test_a_grant_on_a_host_that_never_answers_expires_can_be_cancelled_and_what_it_made_is_checked_in(
    make_user: Callable[..., User],
) -> None:
    with institution(make_user, {"hostA": 1}) as broker:
        broker.config.update(
            poll_every=3600,  # hostA's first list said free; it is asked again only when it nudges
            host_timeout=3.0,
            queue={"max_queued_per_user": 1, "claim_window": "5s", "granting_for": "8s"},
        )
        broker.start()
        alice, bob = make_user(), make_user()
        host = broker.hosts["hostA"]
        assert host.proc is not None
        os.killpg(host.proc.pid, signal.SIGSTOP)  # accepts connections (its backlog), answers none
        try:
            checkout = ("session", "checkout", "--anywhere", "--ttl", "1h", "--wait", "--json")
            mine, his = broker.popen(alice, *checkout), broker.popen(bob, *checkout)  # both asked of hostA
            assert wait_for(lambda: [e["state"] for e in broker.queue_all()] == ["granting", "granting"])
            ((r1,), (r2,)) = ([e["id"] for e in _entries(broker, u)] for u in (alice, bob))
            over = broker.cli(alice, *checkout)  # a stranded grant counts against the cap (1) while it may succeed
            assert over.returncode == 4 and "limit is 1" in over.stderr, over.stderr
            res = broker.cli(alice, "session", "queue", "--cancel", r1)  # and can be cancelled
            assert res.returncode == 0 and "cancelled" in res.stdout, res.stderr
            _, err = mine.communicate(timeout=HANG_S)
            assert mine.returncode == 4 and "cancelled" in err, err

            _, err = his.communicate(timeout=HANG_S)  # ends after granting_for, saying why
            assert his.returncode == 4 and f"request {r2} is expired: host hostA" in err and "did not answer" in err, (
                err
            )
            why = broker.cli(bob, "session", "queue")
            assert f"{r2} expired: host hostA did not answer its checkout for 8 s" in why.stdout, why.stdout
            again = broker.popen(bob, *checkout)  # expired, it no longer counts against his cap
            assert wait_for(lambda: len([e for e in _entries(broker, bob) if e["id"] != r2]) == 1)
            assert again.poll() is None, again.communicate()
        finally:
            os.killpg(host.proc.pid, signal.SIGCONT)
        # hostA serves what waited in its backlog; the broker checks in what it made for r1 and r2 and
        # grants bob's new request (asked again with its own request id, or from the queue).
        out, err = again.communicate(timeout=HANG_S)
        assert again.returncode == 0, err
        granted = json.loads(out)
        assert granted["host"] == "hostA" and granted["request_id"] not in (r1, r2)

        def strays_settled() -> bool:  # the broker asked hostA about r1 and r2 and checked in what it got
            db = sqlite3.connect(f"file:{broker.db}?mode=ro", uri=True)
            try:
                left: int = db.execute("SELECT COUNT(*) FROM strays").fetchone()[0]
                return left == 0
            finally:
                db.close()

        assert wait_for(strays_settled), broker.log()[-4000:]
        made = _sessions_for(broker, "hostA", {r1, r2})  # hostA's backlog, or the broker's own ask, made them
        assert all(ended is not None for _, _, ended in made), made
        live = [st for st in json.loads(host.cli(None, "session", "list", "--json").stdout) if st["busy"]]
        assert [st["session_id"] for st in live] == [granted["session"]["id"]]
        events = _broker_audit(broker)
        assert any(e["event"] == "request_expired" and e["request"] == r2 for e in events), events
        checked_in = {e["request"] for e in events if e["event"] == "stray_checked_in"}
        assert {rid for rid, _, ended in made} <= checked_in, events


@pytest.mark.slow
def test_a_queued_request_whose_client_went_away_is_dropped_and_one_that_came_back_is_granted(
    make_user: Callable[..., User],
) -> None:
    with institution(make_user, {"hostA": 1}) as broker:
        broker.start()  # its claim window: 5 s
        bob, alice, carol = make_user(), make_user(), make_user()
        held = broker.anywhere(bob)
        gone = broker.popen(alice, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait")
        assert wait_for(lambda: [e["state"] for e in _entries(broker, alice)] == ["queued"])
        (rid,) = [e["id"] for e in _entries(broker, alice)]
        gone.kill()  # her terminal is gone, and she does not come back
        gone.wait(HANG_S)

        # carol's client drops and comes back with its request id within the claim window: still hers.
        carol_rid = f"{carol.name}-req-0001"
        first = broker.popen_script(carol, WAITER, carol_rid)
        assert wait_for(lambda: _state(broker, carol_rid) == "queued")
        first.kill()
        first.wait(HANG_S)
        back = broker.popen_script(carol, WAITER, carol_rid)

        assert wait_for(lambda: _state(broker, rid) == "dropped")
        (entry,) = [e for e in _entries(broker, alice) if e["id"] == rid]
        assert "client went away" in entry["note"], entry
        shown = broker.cli(alice, "session", "queue")
        assert f"{rid} dropped: its client went away" in shown.stdout, shown.stdout
        assert any(e["event"] == "request_dropped" and e["request"] == rid for e in _broker_audit(broker))
        assert _state(broker, carol_rid) == "queued"

        # alice was ahead, but nobody waits for her request: carol gets the slice.
        assert broker.hosts["hostA"].cli(bob, "session", "checkin", held["session"]["id"]).returncode == 0
        out, err = back.communicate(timeout=HANG_S)
        assert back.returncode == 0, err
        assert json.loads(out) == {"request": carol_rid, "host": "hostA"}
        assert _state(broker, rid) == "dropped"


def _slice(i: int, profile: str, **state: Any) -> SliceState:
    kind = "mps" if profile == "mps" else "mig"
    sl = Slice(id=f"S-{profile}-{i}", kind=kind, gpu_index=i, gpu_uuid=f"GPU-{i}", profile=profile)
    return SliceState(slice=sl, busy=False, **state)


def test_demand_is_waiters_less_grantable_free_slices_per_profile(tmp_path: Path) -> None:
    """Per class: each free slice that can be granted serves one waiter of its profile; drained and
    unavailable slices serve nobody."""
    now = datetime.now(timezone.utc)
    drain = Drain(gpu=2, reason="firmware", by_user="root", by_uid=0, since=now)
    views = [
        HostView(
            name="h1",
            reachable=True,
            seen_at=now,
            slices=[_slice(0, "1g.5gb"), _slice(1, "1g.5gb"), _slice(2, "1g.5gb", drained=drain)],
        ),
        HostView(name="h2", reachable=True, seen_at=now, slices=[_slice(0, "mps", unavailable=True)]),
    ]
    store = Store(tmp_path / "state/broker.db")
    t = now.timestamp() - 600
    wants = ["1g.5gb", "1g.5gb", "1g.5gb", None, "mps", "1g.5gb"]  # the last one's client has gone
    for i, profile in enumerate(wants):
        kind = "mps" if profile == "mps" else "mig"
        store.submit(
            NewRequest(f"req-{i:05d}", 1000 + i, "u", "a", kind, profile, 3600.0, False, True, t, None), max_queued=9
        )
    settings = DemandSettings(classes={"c": DemandClass(offers=["1g.5gb", "mps"])}, wait_s=30, region="us-east-1")
    gone = Presence()
    for i in range(len(wants) - 1):
        gone.attach(f"req-{i:05d}")
    members = {"h1": "c", "h2": "c"}
    (got,) = count_demand(settings, store.in_state("queued"), views, members, now.timestamp(), gone.present)
    # 1g.5gb: three waiters and the one for any MIG slice against two grantable slices; mps: one, none;
    # the request nobody waits on is no demand.
    assert (got.unserved, got.idle_hosts, got.hosts) == (3, 2, 2)
    store.close()


def test_a_request_pinned_to_one_host_takes_only_its_hosts_slices_and_is_never_demand(tmp_path: Path) -> None:
    """A plain ``checkout`` (or ``--gpu N``) on an institution's host waits for that host (and GPU): a
    host the class adds could never serve it, so it is no demand however long it waits; and it takes
    a free slice only where it could be granted one, never one an unpinned waiter could have."""
    now = datetime.now(timezone.utc)
    views = [HostView(name="h1", reachable=True, seen_at=now, slices=[_slice(0, "1g.5gb"), _slice(1, "1g.5gb")])]
    store = Store(tmp_path / "state/broker.db")
    t = now.timestamp() - 600
    asks: list[tuple[str | None, int | None]] = [
        ("fixed", None),  # on a host of no class, every slice there busy: scaling the class serves nobody
        ("h1", 1),  # --gpu 1 on h1: takes h1's free slice of GPU 1
        ("h1", 3),  # --gpu 3 on h1: nothing free there, and no new host has h1's GPU 3
        (None, None),  # anywhere: takes h1's GPU 0 slice
        (None, None),  # anywhere: unserved, the one reason to grow the class
    ]
    for i, (host, gpu) in enumerate(asks):
        req = NewRequest(f"req-{i:05d}", 1000 + i, "u", "a", "mig", "1g.5gb", 3600.0, False, True, t, None,
                         only_host=host, gpu=gpu)  # fmt: skip
        store.submit(req, max_queued=9)
    settings = DemandSettings(classes={"c": DemandClass(offers=["1g.5gb"])}, wait_s=30, region="us-east-1")
    (got,) = count_demand(settings, store.in_state("queued"), views, {"h1": "c"}, now.timestamp())
    assert (got.unserved, got.idle_hosts, got.hosts) == (1, 1, 1)
    store.close()
