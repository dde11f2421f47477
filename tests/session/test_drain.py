"""Drains (``calque session drain``/``undrain``) on a real daemon, as real users: no new checkout on a
drained GPU (the refusal names who and why), the live sessions there run on, or with ``--by`` get a
notice and end at the new deadline (reason ``drained``, which ``extend`` cannot pass), other GPUs are
untouched, a non-admin can neither drain nor undrain, and a drain survives a ``kill -9`` of the daemon."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from datetime import datetime

import pytest
from support.waits import HANG_S

from .conftest import Host, User, wait_for
from .munged import Munged
from .test_timers import _spawn

pytestmark = pytest.mark.slow


def _admin_host(host: Host, make_user: Callable[..., User], **config: object) -> tuple[User, User, User]:
    """Alice and Bob (researchers) and Ops (the daemon's admin group), on a started daemon."""
    alice, bob = make_user(), make_user()
    group = "cqadm" + alice.name[2:6]
    ops = make_user([group])
    host.config["policy"] = {"admin_group": group, "default": {"max_sessions": 4, "max_ttl": "8h"}}
    host.start(**config)
    return alice, bob, ops


def _end_reason(host: Host, sid: str) -> str | None:
    with sqlite3.connect(host.dir / "state/sessions.db") as db:
        row = db.execute("SELECT end_reason FROM sessions WHERE id=?", (sid,)).fetchone()
    return None if row is None else row[0]


def test_a_drained_gpu_refuses_checkouts_keeps_its_session_and_survives_a_restart(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice, bob, ops = _admin_host(host, make_user)
    s = json.loads(host.cli(alice, "session", "checkout", "--ttl", "1h", "--json", check=True).stdout)
    assert s["gpu_index"] == 0

    # Bob is no admin: he can neither drain nor undrain, and nothing changes when he tries.
    for args in (["drain", "--gpu", "0", "--reason", "mine now"], ["undrain"]):
        res = host.cli(bob, "session", *args)
        assert res.returncode == 4 and "only root or members of" in res.stderr, (args, res.stderr)
    assert json.loads(host.cli(bob, "session", "drains", "--json", check=True).stdout) == []
    assert host.cli(bob, "session", "drain", "--gpu", "0", "--reason", "  ").returncode == 2  # a reason is needed

    out = host.cli(ops, "session", "drain", "--gpu", "0", "--reason", "fan swap", "--json", check=True)
    d = json.loads(out.stdout)
    assert d["drain"]["gpu"] == 0 and d["drain"]["by_user"] == ops.name and d["drain"]["deadline"] is None
    assert [x["id"] for x in d["sessions"]] == [s["id"]] and d["shortened"] == []
    assert d["sessions"][0]["expires_at"] == s["expires_at"]  # no --by: it runs to its own deadline

    def refused_with_reason() -> None:
        res = host.cli(bob, "session", "checkout", "--profile", "1g.5gb", "--ttl", "10m")
        assert res.returncode == 4, res.stderr
        assert "GPU 0 is drained by " + ops.name in res.stderr and "fan swap" in res.stderr, res.stderr
        res = host.cli(bob, "session", "checkout", "--gpu", "0", "--ttl", "10m")
        assert res.returncode == 4 and "fan swap" in res.stderr, res.stderr

    refused_with_reason()
    # The other GPU is not drained: an MPS slot there is Bob's.
    mps = host.cli(bob, "session", "checkout", "--mps", "--i-understand-shared-gpu-has-no-isolation", "--json")
    assert mps.returncode == 0, mps.stderr
    assert json.loads(mps.stdout)["gpu_index"] == 1

    listed = host.cli(alice, "session", "list")
    assert "drained" in listed.stdout and f"drained: GPU 0 is drained by {ops.name}" in listed.stdout, listed.stdout
    states = json.loads(host.cli(alice, "session", "list", "--json", check=True).stdout)
    assert {st["slice"]["gpu_index"] for st in states if st["drained"]} == {0}
    metrics = host.cli(ops, "session", "metrics", check=True).stdout
    assert 'calque_session_drained{gpu="0"} 1.0' in metrics and 'gpu="1"' not in metrics.split("drained")[-1]

    host.kill9()  # the drain is in the registry, not in the process
    host.start()
    refused_with_reason()
    assert [x["id"] for x in json.loads(host.cli(alice, "session", "status", "--json", check=True).stdout)] == [s["id"]]

    res = host.cli(ops, "session", "undrain", "--gpu", "0", check=True)
    assert "fan swap" in res.stdout
    again = host.cli(bob, "session", "checkout", "--profile", "1g.5gb", "--ttl", "10m", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["gpu_index"] == 0
    events = [e["event"] for e in host.audit_events()]
    assert "drain" in events and "undrain" in events
    assert _end_reason(host, s["id"]) is None  # Alice's session was never touched


def test_drain_by_gives_a_notice_and_ends_the_sessions_there_at_the_new_deadline(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice, bob, ops = _admin_host(host, make_user, notice_before=2.0, kill_grace=0.4)
    master, slave = os.openpty()
    os.chown(os.ttyname(slave), alice.uid, -1)
    log = host.dir / "work.log"
    work = _spawn(host, alice, log, "exit-on-term", tty=slave)
    try:
        s = json.loads(host.cli(alice, "session", "checkout", "--ttl", "4h", "--json", check=True).stdout)
        host.sim.add_process(s["slice_id"], work.pid)
        other = host.cli(bob, "session", "checkout", "--mps", "--i-understand-shared-gpu-has-no-isolation", "--json")
        b = json.loads(other.stdout)

        # 15 s to the new deadline: room on a loaded machine for Alice's extend below to land before it.
        t0 = time.time()
        drain = host.cli(ops, "session", "drain", "--gpu", "0", "--by", "15s", "--reason", "driver", "--json")
        assert drain.returncode == 0, drain.stderr
        d = json.loads(drain.stdout)
        assert d["shortened"] == [s["id"]]
        deadline = datetime.fromisoformat(d["sessions"][0]["expires_at"]).timestamp()
        assert t0 + 14 <= deadline <= time.time() + 15.5

        # Alice cannot extend past the drain's deadline (the daemon says why).
        res = host.cli(alice, "session", "extend", s["id"], "--by", "30m")
        assert res.returncode == 4 and "driver" in res.stderr and "cannot be extended past it" in res.stderr

        assert work.wait(HANG_S) == 0  # SIGTERM at the new deadline, as at an expiry (its 4 h TTL is far off)
        assert time.time() >= deadline - 0.5, "the drained session's work ended before the drain's deadline"
        os.set_blocking(master, False)
        seen = os.read(master, 65536).decode(errors="replace")
        assert "driver" in seen and f"Session {s['id']}" in seen and "now ends at" in seen, seen
        assert wait_for(lambda: _end_reason(host, s["id"]) == "drained")
        events = {(e["event"], e.get("session")) for e in host.audit_events()}
        assert ("drain_deadline", s["id"]) in events and ("drained", s["id"]) in events, events
    finally:
        os.close(master)
        os.close(slave)
        if work.poll() is None:
            work.kill()
            work.wait()
    # Bob's slot on the other GPU never moved.
    mine = json.loads(host.cli(bob, "session", "status", "--json", check=True).stdout)
    assert [(x["id"], x["expires_at"]) for x in mine] == [(b["id"], b["expires_at"])]
    assert _end_reason(host, b["id"]) is None


def test_a_host_drain_covers_every_gpu_and_undrain_ends_them_all(host: Host, make_user: Callable[..., User]) -> None:
    alice, bob, ops = _admin_host(host, make_user)
    host.cli(ops, "session", "drain", "--reason", "rack move", check=True)
    host.cli(ops, "session", "drain", "--gpu", "1", "--reason", "mps upgrade", check=True)
    for args in (["--profile", "1g.5gb"], ["--mps", "--i-understand-shared-gpu-has-no-isolation"]):
        res = host.cli(bob, "session", "checkout", *args, "--ttl", "10m")
        assert res.returncode == 4 and "drained by" in res.stderr, res.stderr
    assert "this host is drained" in host.cli(bob, "session", "checkout", "--ttl", "10m").stderr
    table = host.cli(alice, "session", "drains", check=True).stdout
    assert "rack move" in table and "mps upgrade" in table
    ended = json.loads(host.cli(ops, "session", "undrain", "--json", check=True).stdout)
    assert sorted((x["gpu"] is None, x["reason"]) for x in ended) == [(False, "mps upgrade"), (True, "rack move")]
    assert host.cli(bob, "session", "checkout", "--ttl", "10m").returncode == 0
    assert "nothing was drained" in host.cli(ops, "session", "undrain", check=True).stdout


def test_garbage_drain_requests_are_refused_by_name_and_the_daemon_serves_on(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice, bob, ops = _admin_host(host, make_user)
    c = host.client()  # root
    for args, word in (
        ({"reason": "x", "gpu": "0"}, "gpu"),
        ({"reason": "x", "by": -5}, "by"),
        ({"reason": "x", "by": "soon"}, "by"),
        ({"gpu": 0}, "reason"),
        ({"reason": "x", "gpuu": 0}, "gpuu"),
        ({"reason": "x", "gpu": 9}, "no GPU 9"),
    ):
        with pytest.raises(Exception, match=word):
            c.call("drain", **args)
    assert c.drains() == []
    assert host.cli(alice, "session", "checkout", "--ttl", "10m").returncode == 0
    for who in (bob, ops):  # and it still knows who is who
        assert json.loads(host.cli(who, "session", "drains", "--json", check=True).stdout) == []


def test_drain_of_another_host_goes_through_munge_and_that_host_decides_who_is_an_admin(
    host: Host, munged: Munged, make_user: Callable[..., User]
) -> None:
    from .test_crosshost import HOST, Door

    alice, bob = make_user(), make_user()
    group = "cqadm" + alice.name[2:6]
    ops = make_user([group])
    host.config["policy"] = {"admin_group": group, "default": {"max_sessions": 4, "max_ttl": "8h"}}
    door = Door(host, munged)
    inst = host.dir / "institution.yaml"
    remote = ["--institution", str(inst), "--munge-socket", str(munged.socket)]

    res = host.cli(bob, "session", "drain", HOST, "--gpu", "0", "--reason", "mine", *remote)
    assert res.returncode == 4 and "only root or members of" in res.stderr, res.stderr
    res = host.cli(ops, "session", "drain", HOST, "--gpu", "0", "--reason", "over tcp", "--json", *remote)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["drain"]["by_user"] == ops.name
    refused = door.call(alice, "checkout", {"profile": "1g.5gb", "ttl": "10m"}, rid="d" * 16)
    assert refused["exit"] == 4 and "over tcp" in refused["message"], refused
    table = host.cli(alice, "session", "drains", HOST, *remote, check=True).stdout
    assert "over tcp" in table and ops.name in table
    unknown = host.cli(ops, "session", "drain", "nowhere-7", "--reason", "x", *remote)
    assert unknown.returncode == 2 and "teach-1" in unknown.stderr, unknown.stderr
    assert host.cli(ops, "session", "undrain", HOST, *remote).returncode == 0
    assert "ok" in door.call(alice, "checkout", {"profile": "1g.5gb", "ttl": "10m"}, rid="e" * 16)
