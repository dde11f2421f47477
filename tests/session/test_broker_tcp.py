"""The broker reaching host daemons over TCP with munge, not the local path: the broker has no host's
socket, only their ports; it and each host have their own munged with the institution's one key."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable

import pytest

from .conftest import User
from .institution import institution
from .munged import munged
from .test_crossing import free_port

pytestmark = pytest.mark.skipif(shutil.which("munged") is None, reason="munge is not installed")


def test_the_broker_grants_over_tcp_and_a_session_there_is_its_holders_only(make_user: Callable[..., User]) -> None:
    with (
        munged() as brokers_munged,
        munged(brokers_munged.key) as hosts_munged,
        institution(make_user, {"hostA": 1, "hostB": 1}) as broker,
    ):
        hosts = {}
        for name, h in broker.hosts.items():
            port = free_port()
            h.stop()
            h.start(listen_tcp={"address": "127.0.0.1", "port": port}, munge_socket=str(hosts_munged.socket))
            hosts[name] = {"address": "127.0.0.1", "port": port}
        broker.config.update(local_hosts={}, hosts=hosts, munge_socket=str(brokers_munged.socket))
        broker.start()
        alice, bob, mallory = make_user(), make_user(), make_user()
        grants = [broker.anywhere(u) for u in (alice, bob)]
        assert {g["host"] for g in grants} == {"hostA", "hostB"}
        assert [g["session"]["user"] for g in grants] == [alice.name, bob.name]
        g = grants[0]
        here = broker.hosts[g["host"]]
        status = here.cli(alice, "session", "status", "--json")  # the host's own socket agrees
        assert g["session"]["id"] in status.stdout

        # nothing free anywhere: busy names where
        busy = broker.cli(mallory, "session", "checkout", "--anywhere", "--ttl", "1h")
        assert busy.returncode == 5, busy.stderr

        ref = f"{g['session']['id']}@{g['host']}"
        res = broker.cli(mallory, "session", "checkin", ref)
        assert res.returncode == 4 and "not yours" in res.stderr, res.stderr
        res = broker.cli(alice, "session", "checkin", ref, "--json")
        assert res.returncode == 0 and json.loads(res.stdout)["end_reason"] == "checkin", res.stderr
        # the host audited no refusal of the broker's requests: each credential was fresh and bound
        assert not [e for e in here.audit_events() if e["event"] == "crossing_refused"]
