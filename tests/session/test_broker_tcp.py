"""The broker reaching host daemons over TCP with munge, not the local path: the broker has no host's
socket, only institution.yaml's addresses; it and the hosts have their own munged with one key."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Callable

import pytest
import yaml

from .conftest import User
from .institution import institution
from .munged import start_munged, stop_munged

pytestmark = pytest.mark.skipif(shutil.which("munged") is None, reason="munge is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_broker_grants_over_tcp_and_a_session_there_is_its_holders_only(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"hostA": 1, "hostB": 1}) as broker:
        (broker.dir / "munge").mkdir()
        (broker.dir / "munge-hosts").mkdir()
        brokers_munged = start_munged(broker.dir / "munge")
        hosts_munged = start_munged(broker.dir / "munge-hosts", key=brokers_munged.key.read_bytes())
        try:
            ports = {name: _free_port() for name in broker.hosts}
            inst = broker.dir / "institution.yaml"
            inst.write_text(
                yaml.safe_dump(
                    {
                        "version": 1,
                        # hostZ is in the file but nothing listens there: refused connections, skipped (NotSent)
                        "hosts": [{"name": n, "address": "127.0.0.1", "port": p} for n, p in ports.items()]
                        + [{"name": "hostZ", "address": "127.0.0.1", "port": _free_port()}],
                        "broker": {"address": "127.0.0.1", "port": broker.port, "service_user": "root"},
                    }
                )
            )
            inst.chmod(0o644)
            for name, h in broker.hosts.items():
                h.stop()
                h.start(
                    listen_tcp={"address": "127.0.0.1", "port": ports[name]},
                    institution=str(inst),
                    munge_socket=str(hosts_munged.socket),
                )
            broker.config.update(local_hosts={}, institution=str(inst), munge_socket=str(brokers_munged.socket))
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
        finally:
            broker.stop()
            stop_munged(hosts_munged)
            stop_munged(brokers_munged)
