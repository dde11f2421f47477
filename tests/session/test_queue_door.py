"""The institution's queue is the one door (issue 39): on a host whose institution.yaml names a broker,
a checkout keeps the broker's order while the broker answers, and the host serves directly again
(degraded mode, audited and shown) once the broker has been silent for the configured bound.

Real session daemons, a real broker process over their sockets, real second Unix users."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from support.waits import HANG_S

from .conftest import CLI, Host, User, as_user, wait_for
from .institution import Broker, institution

# A direct checkout on the host's own socket, as the calling user: what an old client, or a user
# looping around the CLI, sends: N times (argv[1]) on the socket argv[2], each answer a JSON line.
RAW_CHECKOUT = """
import json, socket, sys
request = {"version": 1, "op": "checkout", "args": {"profile": "1g.5gb", "ttl": "1h"}}
for _ in range(int(sys.argv[1])):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(sys.argv[2])
        s.sendall(json.dumps(request).encode() + b"\\n")
        buf = b""
        while not buf.endswith(b"\\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    print(buf.decode().strip(), flush=True)
"""


def raw_checkouts(h: Host, user: User, tries: int = 1) -> list[dict[str, Any]]:
    res = h.run_as(user, [*h.python, "-c", RAW_CHECKOUT, str(tries), str(h.socket)], env=h.env, timeout=HANG_S)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def door(h: Host) -> dict[str, Any]:
    state = h.client().door()
    assert state is not None
    return state.model_dump(mode="json")


def checkout(h: Host, b: Broker, user: User, *extra: str) -> subprocess.CompletedProcess[str]:
    """A plain ``calque session checkout`` on host ``h`` as ``user`` (the broker on this machine)."""
    return h.cli(user, "session", "checkout", "--profile", "1g.5gb", "--ttl", "1h", "--json",
                 "--broker-socket", str(b.socket), *extra)  # fmt: skip


@contextmanager
def queued_hosts(
    make_user: Callable[..., User],
    bound: float,
    hosts: dict[str, int],
    labs: list[dict[str, Any]] | None = None,
    gpus: int = 1,
    **config: Any,
) -> Iterator[Broker]:
    """An institution whose hosts' institution.yaml names the broker (and ``labs``); hosts (of
    ``gpus`` GPUs each) restarted with a ``degraded_after`` of ``bound`` seconds (and ``config``); the
    broker started, polling and reading the hosts' sessions every half second."""
    with institution(make_user, hosts, gpus) as b:
        broker = {"address": "127.0.0.1", "port": b.port, "service_user": "root"}
        b.write_institution(broker=broker, labs=labs or [])
        (b.dir / "institution.yaml").chmod(0o644)
        for h in b.hosts.values():
            h.stop()
            h.start(institution=str(b.dir / "institution.yaml"), degraded_after=bound, **config)
        b.config["poll_every"] = 0.5
        b.config["queue"] = {"max_queued_per_user": 20, "claim_window": "5s", "usage_every": 0.5}
        b.start()
        yield b


def test_a_direct_checkout_is_refused_while_the_broker_answers_and_served_once_it_is_silent(
    make_user: Callable[..., User],
) -> None:
    admins = "cqad" + secrets.token_hex(3)
    alice, admin, verify = make_user(), make_user([admins]), make_user()
    # 4 s of silence: eight of the broker's half-second polls, so only a broker really gone trips it.
    policy = {"default": {"max_sessions": 100, "max_ttl": "8h"}, "admin_group": admins}
    # direct_users: a local service account (the role's verify user) may pass the queue as an admin may.
    with queued_hosts(make_user, 4.0, {"hostA": 3}, policy=policy, direct_users=[verify.name]) as b:
        h = b.hosts["hostA"]
        assert wait_for(lambda: door(h)["mode"] == "queue")

        # The user's own direct request on the host's socket: refused, naming the command to use.
        [answer] = raw_checkouts(h, alice)
        assert not answer["ok"] and answer["error"]["kind"] == "refused", answer
        assert "calque session checkout" in answer["error"]["message"]
        assert "institution's queue" in answer["error"]["message"]
        # --direct is an admin's: a user's is refused.
        res = checkout(h, b, alice, "--direct")
        assert res.returncode == 4 and "--direct" in res.stderr, res.stderr

        # The plain command goes through the broker, for this host: granted here.
        res = checkout(h, b, alice)
        assert res.returncode == 0, res.stderr
        s = json.loads(res.stdout)
        assert s["user"] == alice.name
        assert [e["state"] for e in b.queue_all() if e["user"] == alice.name] == []  # claimed at once
        # The admin's override: served directly, audited as such.
        res = checkout(h, b, admin, "--direct")
        assert res.returncode == 0, res.stderr
        by_verify = checkout(h, b, verify, "--direct")
        assert by_verify.returncode == 0, by_verify.stderr
        doors = {e["user"]: e["door"] for e in h.audit_events() if e.get("event") == "checkout"}
        assert doors == {alice.name: "broker", admin.name: "override", verify.name: "override"}
        held = ((alice, s["id"]), (admin, json.loads(res.stdout)["id"]), (verify, json.loads(by_verify.stdout)["id"]))
        for user, sid in held:
            assert h.cli(user, "session", "checkin", sid).returncode == 0

        # The broker goes away: after the bound the host serves directly again (degraded mode).
        b.kill9()
        assert wait_for(lambda: door(h)["mode"] == "degraded")
        [answer] = raw_checkouts(h, alice)
        assert answer["ok"], answer
        listed = h.cli(alice, "session", "list")
        assert listed.returncode == 0 and "degraded mode" in listed.stderr, listed.stderr
        status = h.cli(alice, "session", "status", "--json")
        assert "degraded mode" in status.stderr and json.loads(status.stdout)[0]["user"] == alice.name
        res = checkout(h, b, alice)  # the plain command too: the client sees the door open
        assert res.returncode == 0 and "degraded mode" in res.stderr, res.stderr
        events = h.audit_events()
        assert any(e.get("event") == "door_degraded" for e in events)
        degraded = [e for e in events if e.get("event") == "checkout" and e.get("door") == "degraded"]
        assert [e["user"] for e in degraded] == [alice.name, alice.name]

        # The broker is back: the door closes again at its first poll.
        b.start()
        assert wait_for(lambda: door(h)["mode"] == "queue")
        [answer] = raw_checkouts(h, alice)
        assert answer["error"]["kind"] == "refused", answer
        assert any(e.get("event") == "door_restored" for e in h.audit_events())


def test_the_queue_order_holds_against_a_user_looping_checkouts_on_the_host(make_user: Callable[..., User]) -> None:
    holder, waiter, looper = make_user(), make_user(), make_user()
    with queued_hosts(make_user, 30.0, {"hostA": 1}) as b:
        h = b.hosts["hostA"]
        assert wait_for(lambda: door(h)["mode"] == "queue")
        res = checkout(h, b, holder)
        assert res.returncode == 0, res.stderr
        held = json.loads(res.stdout)

        env = {**h.env, "CALQUE_SESSION_SOCKET": str(h.socket), "CALQUE_BROKER_SOCKET": str(b.socket)}
        cmd = [*h.python, "-c", CLI, "session", "checkout", "--profile", "1g.5gb", "--ttl", "1h", "--wait", "--json"]
        waiting = subprocess.Popen(as_user(waiter, cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, cwd=h.dir)  # fmt: skip
        try:
            assert wait_for(lambda: [e["host"] for e in b.queue_all() if e["user"] == waiter.name] == ["hostA"])
            # The looper: the plain command is told the queue is ahead of it; its direct requests are
            # refused, however many, before and after the slice frees.
            busy = checkout(h, b, looper)
            assert busy.returncode == 5 and "already queued" in busy.stderr, busy.stderr
            loop = subprocess.Popen(
                as_user(looper, [*h.python, "-c", RAW_CHECKOUT, "400", str(h.socket)]),
                env=h.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert h.cli(holder, "session", "checkin", held["id"]).returncode == 0
            out, err = waiting.communicate(timeout=HANG_S)
            assert waiting.returncode == 0, err
            got = json.loads(out)
            assert got["user"] == waiter.name and got["slice_id"] == held["slice_id"]
            looped, lerr = loop.communicate(timeout=HANG_S)
            answers = [json.loads(line) for line in looped.splitlines() if line.strip()]
            assert len(answers) == 400, lerr
            assert all(a["error"]["kind"] == "refused" for a in answers)
        finally:
            waiting.kill()
        owners = [e["user"] for e in h.audit_events() if e.get("event") == "checkout"]
        assert owners == [holder.name, waiter.name]


def _queued(b: Broker, user: User) -> list[dict[str, Any]]:
    return [e for e in b.queue_all() if e["user"] == user.name and e["state"] == "queued"]


def test_fair_share_counts_a_degraded_mode_session_and_lab_is_checked_against_groups(
    make_user: Callable[..., User],
) -> None:
    vision, nlp = "cqv" + secrets.token_hex(3), "cqn" + secrets.token_hex(3)
    v1, v2, both = make_user([vision]), make_user([vision]), make_user([vision, nlp])
    labs = [{"name": "vision", "groups": [vision]}, {"name": "nlp", "groups": [nlp]}]
    with queued_hosts(make_user, 3.0, {"hostA": 1}, labs=labs) as b:
        h = b.hosts["hostA"]
        # The broker is down long enough: v1 takes the only slice directly, in degraded mode.
        b.kill9()
        assert wait_for(lambda: door(h)["mode"] == "degraded")
        [answer] = raw_checkouts(h, v1)
        assert answer["ok"], answer
        b.start()
        assert wait_for(lambda: door(h)["mode"] == "queue")

        # --lab names a lab of one's own groups, or is refused saying which are.
        res = checkout(h, b, v2, "--lab", "nlp")
        assert res.returncode == 4 and "none of lab nlp's groups" in res.stderr, res.stderr
        res = checkout(h, b, both, "--lab", "robotics")
        assert res.returncode == 4 and "no lab robotics" in res.stderr, res.stderr

        env = {**h.env, "CALQUE_SESSION_SOCKET": str(h.socket), "CALQUE_BROKER_SOCKET": str(b.socket)}
        base = [*h.python, "-c", CLI, "session", "checkout", "--profile", "1g.5gb", "--ttl", "1h", "--wait", "--json"]

        def wait_as(user: User, *extra: str) -> subprocess.Popen[str]:
            return subprocess.Popen(as_user(user, [*base, *extra]), env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, cwd=h.dir)  # fmt: skip

        first = wait_as(v2)  # vision, and first in line
        try:
            assert wait_for(lambda: bool(_queued(b, v2)))
            second = wait_as(both, "--lab", "nlp")  # later, for nlp (her default would be vision)
            try:
                assert wait_for(lambda: bool(_queued(b, both)))
                assert _queued(b, both)[0]["lab"] == "nlp" and _queued(b, v2)[0]["lab"] == "vision"
                # Vision's usage is v1's degraded-mode session, on hostA's own record: nlp goes first.
                assert wait_for(lambda: _queued(b, both)[0]["position"] == 1), b.queue_all()
                assert _queued(b, v2)[0]["position"] == 2
                assert h.cli(v1, "session", "checkin").returncode == 0
                out, err = second.communicate(timeout=HANG_S)
                assert second.returncode == 0, err
                assert json.loads(out)["user"] == both.name
            finally:
                second.kill()
        finally:
            first.kill()
        billed = {(e.user, e.lab) for e in h.client().ledger("1h").events}
        assert billed == {(v1.name, "vision"), (both.name, "nlp")}
