"""The institution's ledger over TCP with munge: the broker has no host's socket, only
institution.yaml's addresses. Every host's usage comes back (a user's own for a user, through the
broker acting for them), and a host where nothing listens is listed stale with nothing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable

import pytest

from .conftest import LAB_A, User
from .institution import institution, over_tcp

pytestmark = pytest.mark.skipif(shutil.which("munged") is None, reason="munge is not installed")


def test_the_institution_report_over_tcp(make_user: Callable[..., User]) -> None:
    with (
        institution(make_user, {"hostA": 1, "hostB": 1}) as broker,
        over_tcp(broker, labs=[{"name": "lab-a", "groups": [LAB_A]}]),
    ):
        broker.start()
        alice, bob = make_user([LAB_A]), make_user()
        for u, name in ((alice, "hostA"), (bob, "hostB")):
            assert broker.hosts[name].cli(u, "session", "checkout", "--json").returncode == 0

        res = broker.cli(None, "report", "--institution", "--by", "user", "--since", "1d", "--json")
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        sources = {(s["name"], s["stale"]) for s in doc["sources"]}
        assert sources == {("hostA", False), ("hostB", False), ("hostZ", True)}
        assert {r["key"] for r in doc["rows"]} == {alice.name, bob.name}
        by_lab = broker.cli(None, "report", "--institution", "--since", "1d", "--json")
        assert {r["key"] for r in json.loads(by_lab.stdout)["rows"]} == {"lab-a", "-"}

        mine = broker.cli(bob, "report", "--institution", "--by", "user", "--since", "1d", "--json")
        assert mine.returncode == 0, mine.stderr
        assert [r["key"] for r in json.loads(mine.stdout)["rows"]] == [bob.name]  # the host filtered it
        events = [e for h in broker.hosts.values() for e in h.audit_events()]
        assert not [e for e in events if "refused" in e["event"]], events
