"""The institution's ledger over TCP with munge: the broker has no host's socket, only
institution.yaml's addresses. Every host's usage comes back (a user's own for a user, through the
broker acting for them), and a host where nothing listens is listed stale with nothing."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Callable

import pytest
import yaml

from .conftest import LAB_A, User
from .institution import institution
from .munged import start_munged, stop_munged

pytestmark = pytest.mark.skipif(shutil.which("munged") is None, reason="munge is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_institution_report_over_tcp(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"hostA": 1, "hostB": 1}) as broker:
        (broker.dir / "munge").mkdir()
        (broker.dir / "munge-hosts").mkdir()
        brokers_munged = start_munged(broker.dir / "munge")
        hosts_munged = start_munged(broker.dir / "munge-hosts", key=brokers_munged.key.read_bytes())
        try:
            ports = {name: _free_port() for name in broker.hosts}
            inst = broker.dir / "institution.yaml"
            hosts = [{"name": n, "address": "127.0.0.1", "port": p} for n, p in ports.items()]
            inst.write_text(
                yaml.safe_dump(
                    {
                        "version": 1,
                        "hosts": [*hosts, {"name": "hostZ", "address": "127.0.0.1", "port": _free_port()}],
                        "broker": {"address": "127.0.0.1", "port": broker.port, "service_user": "root"},
                        "labs": [{"name": "lab-a", "groups": [LAB_A]}],
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
        finally:
            broker.stop()
            stop_munged(hosts_munged)
            stop_munged(brokers_munged)
