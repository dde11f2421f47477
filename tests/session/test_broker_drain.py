"""The broker routes ``checkout --anywhere`` around drained hosts and GPUs, says so when nothing else
is free, shows them in ``list --all``, and gives a waiting request the host once it is undrained: a
real broker over real daemons, real users."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from support.waits import HANG_S

from .conftest import User, wait_for
from .institution import institution

pytestmark = pytest.mark.slow


def test_anywhere_routes_around_a_drained_host_says_why_and_waits_for_the_undrain(
    make_user: Callable[..., User],
) -> None:
    with institution(make_user, {"hostA": 2, "hostB": 3}) as broker:
        broker.config["poll_every"] = 3600  # after its first look, the broker lists a host only when nudged
        broker.start()
        alice, carol = make_user(), make_user()
        b = broker.hosts["hostB"]
        res = b.cli(None, "session", "drain", "--reason", "firmware update")  # root: the host's admin
        assert res.returncode == 0, res.stderr
        # hostB is the emptiest, but drained: every grant goes to hostA.
        grants = [broker.anywhere(alice), broker.anywhere(alice)]
        assert {g["host"] for g in grants} == {"hostA"}

        busy = broker.cli(carol, "session", "checkout", "--anywhere", "--ttl", "1h")
        assert busy.returncode == 5, busy.stderr
        assert "hostB: hostB is drained by root" in busy.stderr and "firmware update" in busy.stderr, busy.stderr
        assert "hostA: MIG-" in busy.stderr  # and what is busy where, as before

        listed = broker.cli(carol, "session", "list", "--all")
        assert listed.returncode == 0, listed.stderr
        rows = [line.split() for line in listed.stdout.splitlines() if line.startswith("hostB")]
        assert len(rows) == 3 and all("drained" in r for r in rows), listed.stdout
        assert "drained: hostB: this host is drained by root" in listed.stdout

        waiter = broker.popen(carol, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait", "--json")
        assert wait_for(lambda: any(e["user"] == carol.name for e in broker.queue_all()))
        time.sleep(1.0)  # a few of the broker's rounds: it must not grant on the drained host
        assert waiter.poll() is None
        assert json.loads(b.cli(None, "session", "list", "--json").stdout)[0]["busy"] is False

        assert b.cli(None, "session", "undrain").returncode == 0
        out, err = waiter.communicate(timeout=HANG_S)  # granted by the host's nudge: no poll comes in time
        assert waiter.returncode == 0, err
        got = json.loads(out)
        assert got["host"] == "hostB" and got["session"]["user"] == carol.name


def test_a_host_drained_since_the_brokers_last_list_keeps_a_waiting_request_queued(
    make_user: Callable[..., User],
) -> None:
    with institution(make_user, {"hostA": 1}) as broker:
        broker.config["poll_every"] = 3600  # the broker looks again only when nudged, or refused
        broker.start()
        alice = make_user()
        a = broker.hosts["hostA"]
        listed = lambda: broker.cli(alice, "session", "list", "--all").stdout.split()  # noqa: E731
        assert wait_for(lambda: "free" in listed())

        def restart(nudge: str) -> None:
            a.stop()
            a.config["broker_nudge"] = nudge
            a.start()

        restart("127.0.0.1:9")  # this drain's nudge is lost: the broker still believes the slice free
        assert a.cli(None, "session", "drain", "--gpu", "0", "--reason", "bad fan").returncode == 0
        waiter = broker.popen(alice, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait", "--json")
        # hostA refuses (drained); the broker lists it again, sees the drain, and the request waits.
        assert wait_for(lambda: any(e["state"] == "queued" for e in broker.queue_all()))
        time.sleep(1.0)
        assert waiter.poll() is None, waiter.communicate()
        assert "drained" in listed() and "free" not in listed()

        restart(f"127.0.0.1:{broker.port}")
        assert a.cli(None, "session", "undrain", "--gpu", "0").returncode == 0  # nudges the broker
        out, err = waiter.communicate(timeout=HANG_S)
        assert waiter.returncode == 0, err
        assert json.loads(out)["host"] == "hostA"
