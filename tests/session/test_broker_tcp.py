"""The broker reaching host daemons over TCP with munge, not the local path: the broker has no host's
socket, only institution.yaml's addresses; it and the hosts have their own munged with one key."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable

import pytest

from .conftest import User
from .institution import institution, over_tcp

pytestmark = pytest.mark.skipif(shutil.which("munged") is None, reason="munge is not installed")


def test_the_broker_grants_over_tcp_and_a_session_there_is_its_holders_only(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"hostA": 1, "hostB": 1}) as broker, over_tcp(broker):
        broker.start()
        alice, bob, mallory = make_user(), make_user(), make_user()
        grants = [broker.anywhere(u) for u in (alice, bob)]
        assert {g["host"] for g in grants} == {"hostA", "hostB"}
        assert "host hostZ does not answer" in broker.log()
        assert [g["session"]["user"] for g in grants] == [alice.name, bob.name]
        g = grants[0]
        here = broker.hosts[g["host"]]
        status = here.cli(alice, "session", "status", "--json")  # the host's own socket agrees
        assert g["session"]["id"] in status.stdout

        busy = broker.cli(mallory, "session", "checkout", "--anywhere", "--ttl", "1h")
        assert busy.returncode == 5, busy.stderr

        ref = f"{g['session']['id']}@{g['host']}"
        res = broker.cli(mallory, "session", "checkin", ref)
        assert res.returncode == 4 and "not yours" in res.stderr, res.stderr
        res = broker.cli(alice, "session", "checkin", ref, "--json")
        assert res.returncode == 0 and json.loads(res.stdout)["end_reason"] == "checkin", res.stderr
        # every call the broker made carried a fresh credential bound to it: the hosts refused none
        events = [e["event"] for h in broker.hosts.values() for e in h.audit_events()]
        assert "checkout" in events and not [e for e in events if "refused" in e], events
