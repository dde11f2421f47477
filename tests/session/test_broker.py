"""The broker as a researcher meets it: a real broker process over real session daemons, real Unix
users, real SQLite files."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from .conftest import User, wait_for
from .institution import institution


def test_two_users_fill_every_slice_and_a_third_is_granted_within_1s_of_a_checkin(
    make_user: Callable[..., User],
) -> None:
    with institution(make_user, {"hostA": 2, "hostB": 2, "hostC": 2}) as broker:
        broker.start()
        alice, bob, carol = make_user(), make_user(), make_user()
        grants = [broker.anywhere(u) for u in (alice, bob) * 3]
        slices = {(g["host"], g["session"]["slice_id"]) for g in grants}
        assert len(slices) == 6 and {h for h, _ in slices} == {"hostA", "hostB", "hostC"}
        assert {g["session"]["user"] for g in grants} == {alice.name, bob.name}
        # Each session is its host's, held by its user there.
        a0 = grants[0]
        status = broker.hosts[a0["host"]].cli(alice, "session", "status", "--json")
        assert a0["session"]["id"] in status.stdout

        # None free: exit 5 names what is busy where and until when.
        busy = broker.cli(carol, "session", "checkout", "--anywhere", "--ttl", "1h")
        assert busy.returncode == 5, busy.stderr
        assert "hostA: MIG-" in busy.stderr and "hostC: MIG-" in busy.stderr and "until" in busy.stderr
        assert "--wait" in busy.stderr

        waiter = broker.popen(carol, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait", "--json")
        assert wait_for(lambda: any(e["user"] == carol.name for e in broker.queue_all()), timeout=30)
        mine = json.loads(broker.cli(carol, "session", "queue", "--json").stdout)
        assert [e["state"] for e in mine] == ["queued"] and mine[0]["position"] == 1
        assert mine[0]["estimate"] is not None  # from the holders' deadlines

        freed = grants[3]  # bob's, on whichever host it landed
        res = broker.hosts[freed["host"]].cli(bob, "session", "checkin", freed["session"]["id"])
        assert res.returncode == 0, res.stderr
        checked_in = time.monotonic()
        out, err = waiter.communicate(timeout=30)
        granted_after = time.monotonic() - checked_in
        assert waiter.returncode == 0, err
        got = json.loads(out)
        assert got["host"] == freed["host"] and got["session"]["slice_id"] == freed["session"]["slice_id"]
        assert got["session"]["user"] == carol.name
        assert granted_after < 1.0, f"granted {granted_after:.2f} s after the check-in"
