"""The broker as a researcher meets it: a real broker process over real session daemons, real Unix
users, real SQLite files."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable
from typing import Any

from support.waits import HANG_S

from .conftest import Host, User, wait_for
from .institution import Broker, institution
from .munged import Munged


def test_two_users_fill_every_slice_and_a_third_is_granted_at_a_checkin_by_the_hosts_nudge(
    make_user: Callable[..., User],
) -> None:
    with institution(make_user, {"hostA": 2, "hostB": 2, "hostC": 2}) as broker:
        # The broker lists every host at its start and then only when a host nudges it (its poll is an
        # hour off): the waiter below can be granted only because the check-in's host nudged it.
        broker.config["poll_every"] = 3600
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
        assert wait_for(lambda: any(e["user"] == carol.name for e in broker.queue_all()))
        mine = json.loads(broker.cli(carol, "session", "queue", "--json").stdout)
        assert [e["state"] for e in mine] == ["queued"] and mine[0]["position"] == 1
        assert mine[0]["estimate"] is not None  # from the holders' deadlines

        freed = grants[3]  # bob's, on whichever host it landed
        res = broker.hosts[freed["host"]].cli(bob, "session", "checkin", freed["session"]["id"])
        assert res.returncode == 0, res.stderr
        out, err = waiter.communicate(timeout=HANG_S)
        assert waiter.returncode == 0, err
        got = json.loads(out)
        assert got["host"] == freed["host"] and got["session"]["slice_id"] == freed["session"]["slice_id"]
        assert got["session"]["user"] == carol.name


def _waiting(broker: Broker, user: User) -> list[dict[str, Any]]:
    return [e for e in broker.queue_all() if e["user"] == user.name and e["state"] == "queued"]


AGING_S = 30.0


def test_lab_fair_share_order_and_aging_by_a_scripted_sequence(make_user: Callable[..., User]) -> None:
    # Unique Unix group names: a run killed half-way (or another run on this machine) leaves its groups behind.
    vision, nlp = "cqv" + secrets.token_hex(3), "cqn" + secrets.token_hex(3)
    with institution(make_user, {"hostA": 2}) as broker:
        broker.write_institution(
            labs=[
                {"name": "vision", "groups": [vision], "share": 1},
                {"name": "nlp", "groups": [nlp], "share": 1},
            ]
        )
        # Aging at 30 s: a2 must still be younger than that while the test queues b1, reads the order and
        # checks a slice in (half a dozen commands, each seconds long on a loaded machine).
        broker.config["queue"] = {"aging": f"{AGING_S:g}s", "max_queued_per_user": 4, "claim_window": "5s"}
        broker.start()
        a1, a2 = make_user([vision]), make_user([vision])
        b1, b2 = make_user([nlp]), make_user([nlp])
        held = [broker.anywhere(a1), broker.anywhere(a1)]  # lab vision uses the host alone for a while
        time.sleep(2.0)
        wa2 = broker.popen(a2, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait", "--json")
        assert wait_for(lambda: bool(_waiting(broker, a2)))
        wb1 = broker.popen(b1, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait", "--json")
        assert wait_for(lambda: bool(_waiting(broker, b1)))
        # Lab nlp is below its share (it used nothing), so its later request is ahead of vision's.
        order = {e["user"]: e["position"] for e in broker.queue_all() if e["state"] == "queued"}
        assert order == {b1.name: 1, a2.name: 2}, order
        assert (
            broker.cli(
                a1, "session", "checkin", "--socket", str(broker.hosts["hostA"].socket), held[0]["session"]["id"]
            ).returncode
            == 0
        )
        out, err = wb1.communicate(timeout=HANG_S)
        assert wb1.returncode == 0, err
        assert json.loads(out)["session"]["user"] == b1.name
        assert _waiting(broker, a2)  # still waiting

        # Aging: once a2 has waited 30 s it goes ahead of every later request, whatever its lab's usage.
        enqueued = _waiting(broker, a2)[0]["enqueued_at"]
        from datetime import datetime

        aged_at = datetime.fromisoformat(enqueued).timestamp() + AGING_S + 0.5
        time.sleep(max(0.0, aged_at - time.time()))
        wb2 = broker.popen(b2, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait", "--json")
        assert wait_for(lambda: bool(_waiting(broker, b2)))
        order = {e["user"]: e["position"] for e in broker.queue_all() if e["state"] == "queued"}
        assert order == {a2.name: 1, b2.name: 2}, order
        assert (
            broker.cli(
                a1, "session", "checkin", "--socket", str(broker.hosts["hostA"].socket), held[1]["session"]["id"]
            ).returncode
            == 0
        )
        out, err = wa2.communicate(timeout=HANG_S)
        assert wa2.returncode == 0, err
        assert json.loads(out)["session"]["user"] == a2.name
        wb2.terminate()
        wb2.wait(HANG_S)


def test_a_user_cannot_cancel_or_see_another_users_request(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"hostA": 1}) as broker:
        broker.start()
        alice, bob = make_user(), make_user()
        broker.anywhere(bob)
        waiter = broker.popen(alice, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait")
        assert wait_for(lambda: bool(_waiting(broker, alice)))
        rid = _waiting(broker, alice)[0]["id"]
        res = broker.cli(bob, "session", "queue", "--cancel", rid)
        assert res.returncode == 4 and "not yours" in res.stderr, res.stderr
        assert broker.cli(bob, "session", "queue", "--all").returncode == 4
        bobs = json.loads(broker.cli(bob, "session", "queue", "--json").stdout)
        assert bobs == []  # his own requests only: none
        assert _waiting(broker, alice)[0]["id"] == rid  # untouched
        res = broker.cli(alice, "session", "queue", "--cancel", rid)
        assert res.returncode == 0 and "cancelled" in res.stdout, res.stderr
        _, err = waiter.communicate(timeout=HANG_S)
        assert waiter.returncode == 4 and "cancelled" in err, err


WAITERS = """
import json, sys, threading
from calque.models.broker import AnywhereArgs
from calque.session.client.broker import BrokerClient
prefix, n = sys.argv[1], int(sys.argv[2])
lock = threading.Lock()
def one(i):
    try:
        g = BrokerClient(reconnect_for=60).anywhere(AnywhereArgs(ttl="1h", wait=True, request_id=f"{prefix}-{i:04d}"))
        line = json.dumps({"request": g.request_id, "host": g.host, "session": g.session.id})
    except Exception as exc:
        line = json.dumps({"error": str(exc)})
    with lock:
        print(line, flush=True)
threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
"""


def _written_by(pgid: int, uid: int) -> bool:
    """Whether a process of group ``pgid`` running as ``uid`` has a unix stream socket with bytes written
    that its peer has not read (``ss``'s Send-Q)."""
    out = subprocess.run(["ss", "-xnpH"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4 or not fields[3].isdigit() or int(fields[3]) == 0:
            continue
        for pid in re.findall(r"pid=(\d+)", line):
            try:
                if os.getpgid(int(pid)) == pgid and os.stat(f"/proc/{pid}").st_uid == uid:
                    return True
            except OSError:
                continue
    return False


def _sessions_by_request(broker: Broker) -> dict[str, list[tuple[str, str]]]:
    """Every session the hosts' registries hold that a request id made, by request id."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name, h in broker.hosts.items():
        db = sqlite3.connect(str(h.dir / "state/sessions.db"))
        for rid, sid in db.execute("SELECT request_id, id FROM sessions WHERE request_id IS NOT NULL"):
            out.setdefault(rid, []).append((name, sid))
        db.close()
    return out


def test_kill_9_of_the_broker_with_20_queued_loses_none_and_grants_no_slice_twice(
    make_user: Callable[..., User],
) -> None:
    with institution(make_user, {"hostA": 2, "hostB": 2}) as broker:
        broker.start()
        filler, u1, u2 = make_user(), make_user(), make_user()
        held = [broker.anywhere(filler) for _ in range(4)]
        procs = [broker.popen_script(u, WAITERS, f"{u.name}-req", "10") for u in (u1, u2)]
        assert wait_for(lambda: sum(e["state"] == "queued" for e in broker.queue_all()) == 20)
        before = {e["id"]: e for e in broker.queue_all()}

        # Two slices free and the broker dies at once, in the middle of granting them.
        for g in held[:2]:
            h = broker.hosts[g["host"]]
            assert h.cli(filler, "session", "checkin", g["session"]["id"]).returncode == 0
        broker.kill9()
        broker.start()

        def settled() -> bool:
            q = broker.queue_all()
            return sum(e["state"] == "queued" for e in q) == 18

        assert wait_for(settled), broker.queue_all()
        after = {e["id"]: e for e in broker.queue_all()}
        assert set(after) <= set(before)  # nothing new, nothing lost: 18 queued, 2 granted
        assert all(before[i]["enqueued_at"] == after[i]["enqueued_at"] for i in after)
        by_request = _sessions_by_request(broker)
        mine = {rid: s for rid, s in by_request.items() if rid.startswith((u1.name, u2.name))}
        assert len(mine) == 2 and all(len(s) == 1 for s in mine.values()), mine

        # The other two free: four grants in all, each request one session, each slice one holder.
        for g in held[2:]:
            assert broker.hosts[g["host"]].cli(filler, "session", "checkin", g["session"]["id"]).returncode == 0
        assert wait_for(lambda: sum(e["state"] == "queued" for e in broker.queue_all()) == 16)
        by_request = _sessions_by_request(broker)
        mine = {rid: s for rid, s in by_request.items() if rid.startswith((u1.name, u2.name))}
        assert len(mine) == 4 and all(len(s) == 1 for s in mine.values()), mine
        for p in procs:
            p.terminate()
        lines = [json.loads(line) for p in procs for line in p.communicate(timeout=HANG_S)[0].splitlines()]
        granted = [x for x in lines if "request" in x]
        assert sorted(x["request"] for x in granted) == sorted(mine), lines  # each client got its grant


def test_a_stopped_host_leaves_the_others_serving_and_its_sessions_are_back(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"hostA": 1, "hostB": 2, "hostC": 1}) as broker:
        broker.start()
        alice = make_user()
        first = broker.anywhere(alice)
        assert first["host"] == "hostB"  # the emptiest
        broker.hosts["hostB"].stop()
        got = {broker.anywhere(alice)["host"] for _ in range(2)}
        assert got == {"hostA", "hostC"}
        busy = broker.cli(alice, "session", "checkout", "--anywhere", "--ttl", "1h")
        assert busy.returncode == 5 and "hostB does not answer" in busy.stderr, busy.stderr
        listed = broker.cli(alice, "session", "list", "--all")
        assert listed.returncode == 0 and "hostB" in listed.stderr and "unreachable" in listed.stdout
        broker.hosts["hostB"].start()

        # The broker lists it again by itself (polls): its session is back, its free slice granted.
        def back() -> bool:
            res = broker.cli(alice, "session", "list", "--all", "--json")
            views = {v["name"]: v for v in json.loads(res.stdout)}
            return views["hostB"]["reachable"] and first["session"]["id"] in json.dumps(views["hostB"])

        assert wait_for(back)
        assert first["session"]["id"] in broker.cli(alice, "session", "status", "--all").stdout
        assert broker.anywhere(alice)["host"] == "hostB"
        # With the broker down, a host-local checkout works as it always did.
        broker.stop()
        host_a = broker.hosts["hostA"]
        assert host_a.cli(alice, "session", "checkin").returncode == 0  # her one session there
        res = host_a.cli(alice, "session", "checkout", "--ttl", "10m", "--json")
        assert res.returncode == 0 and json.loads(res.stdout)["user"] == alice.name, res.stderr
        assert broker.cli(alice, "session", "checkout", "--anywhere").returncode == 6  # only the front door waits


def test_a_grant_cut_by_kill_9_is_finished_on_its_host_with_the_same_request_id(make_user: Callable[..., User]) -> None:
    """The broker has asked hostB for a checkout (the row is ``granting``) and hostB has not answered
    when the broker is killed; hostB then makes the session. The restarted broker asks hostB again
    with the same request id: the same session comes back, the client gets it, and no second slice."""
    with institution(make_user, {"hostB": 2}) as broker:
        broker.config["host_timeout"] = 3600  # its call to hostB waits for the answer until the broker dies
        broker.start()
        alice = make_user()
        host = broker.hosts["hostB"]
        assert host.proc is not None
        os.killpg(host.proc.pid, signal.SIGSTOP)  # accepts connections (the backlog), answers nothing
        try:
            waiter = broker.popen(alice, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait", "--json")

            def granting() -> list[str]:
                db = sqlite3.connect(f"file:{broker.db}?mode=ro", uri=True)
                try:
                    return [r[0] for r in db.execute("SELECT id FROM requests WHERE state='granting' AND host='hostB'")]
                finally:
                    db.close()

            def asked() -> bool:  # the broker's call waits in hostB's accept queue (hostB, stopped, took none)
                out = subprocess.run(
                    ["ss", "-xlnH", "src", str(host.socket)], capture_output=True, text=True, check=False
                ).stdout.split()
                return len(out) >= 3 and int(out[2]) >= 1

            def sent() -> bool:  # the broker (root, naming alice) wrote it: its socket holds it, unread by hostB
                assert broker.proc is not None
                return _written_by(broker.proc.pid, 0)

            assert wait_for(lambda: bool(granting()))
            (rid,) = granting()
            # The row is committed before the call: kill the broker only once the call is on its way (its
            # call connects, then writes), or hostB would never see it.
            assert wait_for(asked)
            assert wait_for(sent)
            broker.kill9()
        finally:
            os.killpg(host.proc.pid, signal.SIGCONT)
        # hostB serves the request the dead broker sent: the session exists before the broker is back.
        assert wait_for(lambda: rid in _sessions_by_request(broker))
        broker.start()
        out, err = waiter.communicate(timeout=HANG_S)
        assert waiter.returncode == 0, err
        got = json.loads(out)
        assert got["request_id"] == rid and got["host"] == "hostB"
        assert _sessions_by_request(broker)[rid] == [("hostB", got["session"]["id"])]  # one session, the same
        live = json.loads(host.cli(None, "session", "list", "--json").stdout)
        assert sum(1 for st in live if st["busy"]) == 1


class _Sink:
    """A real SMTP server (aiosmtpd) on 127.0.0.1 that keeps what it is sent."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        from email import message_from_bytes

        self.messages.append(message_from_bytes(envelope.content))
        return "250 OK"


def test_a_granted_waiter_and_a_session_near_its_end_are_mailed(make_user: Callable[..., User]) -> None:
    import socket

    from aiosmtpd.controller import Controller

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sink = _Sink()
    smtp = Controller(sink, hostname="127.0.0.1", port=port)
    smtp.start()
    try:
        with institution(make_user, {"hostA": 1}) as broker:
            broker.config["mail"] = {"relay": "127.0.0.1", "port": port, "domain": "example.edu", "before_end": ["50s"]}
            broker.start()
            alice, bob = make_user(), make_user()
            first = broker.anywhere(bob)
            waiter = broker.popen(alice, "session", "checkout", "--anywhere", "--ttl", "55s", "--wait", "--json")
            assert wait_for(lambda: bool(_waiting(broker, alice)))
            assert broker.hosts["hostA"].cli(bob, "session", "checkin", first["session"]["id"]).returncode == 0
            out, err = waiter.communicate(timeout=HANG_S)
            assert waiter.returncode == 0, err
            ref = f"{json.loads(out)['session']['id']}@hostA"
            assert wait_for(lambda: len(sink.messages) >= 2), [m["Subject"] for m in sink.messages]
            to_alice = [m for m in sink.messages if m["To"] == f"{alice.name}@example.edu"]
            subjects = sorted(m["Subject"] for m in to_alice)
            assert subjects[0] == f"[calque] {ref} ends in " + subjects[0].rsplit(" ends in ", 1)[1]
            assert subjects[1] == f"[calque] {ref} granted"
            assert not any(m["To"].startswith(bob.name) for m in sink.messages)  # a direct checkout is not mailed
    finally:
        smtp.stop()


def test_a_session_on_another_host_is_extended_read_and_checked_in_by_its_holder_only(
    make_user: Callable[..., User],
) -> None:
    with institution(make_user, {"hostA": 1, "hostB": 1}) as broker:
        broker.start()
        alice, mallory = make_user(), make_user()
        g = broker.anywhere(alice)
        ref = f"{g['session']['id']}@{g['host']}"
        res = broker.cli(alice, "session", "extend", ref, "--by", "10m", "--json")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["expires_at"] > g["session"]["expires_at"]
        env = broker.cli(alice, "session", "env", ref, "--shell")
        assert env.returncode == 0 and f"CALQUE_SESSION_ID={g['session']['id']}" in env.stdout, env.stderr

        # Holders are the admins' to see (and the holder's own), across hosts as on one.
        def holders(user: User | None) -> set[str]:
            views = json.loads(broker.cli(user, "session", "list", "--all", "--json").stdout)
            return {st["holder"] for v in views for st in v["slices"] if st.get("holder")}

        assert wait_for(lambda: holders(None) == {alice.name})
        assert holders(alice) == {alice.name} and holders(mallory) == set()
        # Another user names it: the host refuses, as it would on the host itself.
        for verb in (["checkin", ref], ["extend", ref, "--by", "1h"]):
            res = broker.cli(mallory, "session", *verb)
            assert res.returncode == 4 and "not yours" in res.stderr, res.stderr
        assert broker.cli(mallory, "session", "env", ref).returncode == 2
        res = broker.cli(alice, "session", "checkin", ref, "--json")
        assert res.returncode == 0 and json.loads(res.stdout)["end_reason"] == "checkin", res.stderr
        live = json.loads(broker.hosts[g["host"]].cli(None, "session", "list", "--json").stdout)
        assert not any(st["busy"] for st in live)


def test_the_broker_survives_garbage_and_keeps_its_queue(make_user: Callable[..., User]) -> None:
    import socket

    with institution(make_user, {"hostA": 1}) as broker:
        broker.config["request_timeout"] = 1.0
        broker.start()
        alice, bob = make_user(), make_user()
        broker.anywhere(bob)
        waiter = broker.popen(alice, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait")
        assert wait_for(lambda: bool(_waiting(broker, alice)))
        frames = [
            b"not json\n",
            b'{"version": 99, "op": "ping"}\n',
            b'{"version": 1, "op": "format_disk"}\n',
            b'{"version": 1, "op": "anywhere", "args": {"mps": true}}\n',
            b'{"version": 1, "op": "anywhere", "args": {"request_id": "../../etc", "profile": "1g.5gb"}}\n',
            b'{"version": 1, "op": "cancel", "args": {"id": ["x"]}}\n',
            b"x" * (200 * 1024) + b"\n",
            b'{"version": 1, "op": "ping"',  # never finished: the broker gives up after request_timeout
        ]
        for frame in frames:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(10)
                s.connect(str(broker.socket))
                s.sendall(frame)
                reply = s.recv(65536)
            assert b'"ok":false' in reply, (frame[:60], reply)
        ping = broker.cli(alice, "session", "queue", "--json")
        assert ping.returncode == 0 and len(json.loads(ping.stdout)) == 1  # the queue as it was
        waiter.terminate()
        waiter.wait(HANG_S)


def test_a_grant_nobody_claims_passes_on_after_the_claim_window(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"hostA": 1}) as broker:
        # A claim window of 15 s: long enough for the test to see alice's grant held (a command or two).
        broker.config["queue"] = {"max_queued_per_user": 20, "claim_window": "15s"}
        broker.start()
        alice, bob, carol = make_user(), make_user(), make_user()
        held = broker.anywhere(bob)
        gone = broker.popen(alice, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait")
        assert wait_for(lambda: bool(_waiting(broker, alice)))
        rid = _waiting(broker, alice)[0]["id"]
        gone.kill()  # her terminal is gone: the request stays in the queue
        gone.wait(HANG_S)
        later = broker.popen(carol, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait", "--json")
        assert wait_for(lambda: bool(_waiting(broker, carol)))
        assert broker.hosts["hostA"].cli(bob, "session", "checkin", held["session"]["id"]).returncode == 0
        assert wait_for(lambda: any(e["id"] == rid and e["state"] == "held" for e in broker.queue_all()))
        out, err = later.communicate(timeout=HANG_S)
        assert later.returncode == 0, err
        assert json.loads(out)["session"]["user"] == carol.name
        # Held for alice through the whole claim window, then passed on: by the broker's own clock, carol's
        # grant came no sooner than the window's length after alice's.
        db = sqlite3.connect(f"file:{broker.db}?mode=ro", uri=True)
        (state, alice_granted) = db.execute("SELECT state, granted_at FROM requests WHERE id=?", (rid,)).fetchone()
        (carol_granted,) = db.execute("SELECT granted_at FROM requests WHERE user=?", (carol.name,)).fetchone()
        db.close()
        assert state == "lapsed"
        assert carol_granted >= alice_granted + 15.0, (alice_granted, carol_granted)
        assert alice.name not in broker.hosts["hostA"].cli(None, "session", "list").stdout  # given back there


def test_the_last_host_first_and_a_cap_on_queued_requests(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"hostA": 2, "hostB": 3}) as broker:
        broker.config["queue"] = {"max_queued_per_user": 2}
        broker.start()
        alice, bob = make_user(), make_user()
        first = broker.anywhere(alice)
        assert first["host"] == "hostB"  # the emptiest
        assert broker.cli(alice, "session", "checkin", f"{first['session']['id']}@hostB").returncode == 0
        bobs = [broker.anywhere(bob), broker.anywhere(bob)]
        assert {g["host"] for g in bobs} == {"hostB"}  # hostB: 3 free, then 2; hostA: 2
        assert broker.anywhere(alice)["host"] == "hostB"  # 1 free there, 2 on hostA: her last host first
        for _ in range(2):
            broker.anywhere(alice)  # hostA's two
        waiters = [broker.popen(alice, "session", "checkout", "--anywhere", "--wait") for _ in range(2)]
        assert wait_for(lambda: len(_waiting(broker, alice)) == 2)
        third = broker.cli(alice, "session", "checkout", "--anywhere", "--wait")
        assert third.returncode == 4 and "limit is 2" in third.stderr, third.stderr
        for w in waiters:
            w.terminate()
            w.wait(HANG_S)


def _refused_tries(host: Host, user: User) -> int:
    """The tries of ``user``'s asks that ``host`` refused for want of a slot (its demand record)."""
    db = sqlite3.connect(f"file:{host.dir / 'state/sessions.db'}?mode=ro", uri=True)
    try:
        (n,) = db.execute("SELECT COALESCE(SUM(attempts), 0) FROM demand WHERE uid=?", (user.uid,)).fetchone()
    finally:
        db.close()
    return int(n)


def test_an_mps_slot_refused_to_a_user_is_waited_for_without_spinning(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"mpsHost": -2}) as broker:
        broker.start()
        alice, bob = make_user(), make_user()
        mps = ("--mps", "--i-understand-shared-gpu-has-no-isolation")
        held = broker.anywhere(bob, *mps)
        assert held["session"]["kind"] == "mps"
        # The second slot is free, but MPS serialises users: the host refuses it to alice while bob holds one.
        waiter = broker.popen(alice, "session", "checkout", "--anywhere", "--ttl", "1h", *mps, "--wait", "--json")
        assert wait_for(lambda: bool(_waiting(broker, alice)))
        # mpsHost counts every refused try of alice's ask. The broker tries it directly, then once from its
        # queue, and then not again until mpsHost's slots change (a spinning broker asks on and on); a loop
        # that catches the direct try between its answer and its return to the queue may try once more.
        mps_host = broker.hosts["mpsHost"]
        assert wait_for(lambda: _refused_tries(mps_host, alice) >= 2), _refused_tries(mps_host, alice)
        time.sleep(3.0)  # six of the broker's loops (0.5 s) and a poll of every host (2 s): none asks again
        tries = _refused_tries(mps_host, alice)
        assert tries <= 3, f"the broker asked mpsHost {tries} times for alice while nothing changed there"
        assert _waiting(broker, alice)
        assert broker.hosts["mpsHost"].cli(bob, "session", "checkin", held["session"]["id"]).returncode == 0
        out, err = waiter.communicate(timeout=HANG_S)
        assert waiter.returncode == 0, err
        assert json.loads(out)["session"]["user"] == alice.name


def test_wait_timeout_gives_up_in_time_and_shell_exports_name_the_host(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"hostA": 1}) as broker:
        broker.start()
        alice, bob = make_user(), make_user()
        res = broker.cli(bob, "session", "checkout", "--anywhere", "--ttl", "1h", "--shell")
        assert res.returncode == 0, res.stderr
        assert "export CALQUE_SESSION_HOST=hostA" in res.stdout and "export CUDA_VISIBLE_DEVICES=MIG-" in res.stdout
        started = time.monotonic()
        # Nothing frees hostA's one slice: the command returns (before HANG_S) only because it gave up.
        res = broker.cli(alice, "session", "checkout", "--anywhere", "--wait", "--wait-timeout", "2s")
        took = time.monotonic() - started
        assert res.returncode == 5 and "waited" in res.stderr and "hostA: MIG-" in res.stderr, res.stderr
        assert took >= 2.0, f"gave up after {took:.2f} s, before its 2 s"
        assert not _waiting(broker, alice)  # it left the queue


def test_a_host_reached_over_tcp_with_munge_is_granted_for_the_user(
    make_user: Callable[..., User], munged: Munged
) -> None:
    """hostR is not on the broker's machine as far as the broker knows: it is in institution.yaml with
    a TCP address, and the broker reaches it with RemoteHost, its own munge credential acting for the
    user; hostR checks the credential and that root (the broker's service user) may act for users."""
    with institution(make_user, {"hostL": 1, "hostR": 1}) as broker:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            tcp = probe.getsockname()[1]
        broker.write_institution(
            hosts=[{"name": "hostR", "address": "127.0.0.1", "port": tcp, "offers": ["1g.5gb"]}],
            broker={"address": "127.0.0.1", "port": broker.port, "service_user": "root"},
        )
        remote = broker.hosts["hostR"]
        remote.stop()
        remote.start(
            listen_tcp={"address": "127.0.0.1", "port": tcp},
            institution=str(broker.dir / "institution.yaml"),
            munge_socket=str(munged.socket),
        )
        broker.config["local_hosts"] = {"hostL": str(broker.hosts["hostL"].socket)}
        broker.config["munge_socket"] = str(munged.socket)
        broker.start()
        alice, bob = make_user(), make_user()
        got = {broker.anywhere(alice)["host"] for _ in range(2)}
        assert got == {"hostL", "hostR"}  # one slice each: the second --anywhere went over TCP
        listed = json.loads(remote.cli(None, "session", "list", "--json").stdout)
        assert [st["holder"] for st in listed if st["busy"]] == [alice.name]  # hostR's own registry
        # bob waits; alice checks hostR's slice in through the broker (over TCP, as alice): bob gets it.
        waiter = broker.popen(bob, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait", "--json")
        assert wait_for(lambda: bool(_waiting(broker, bob)))
        sid = next(st["session_id"] for st in listed if st["busy"])
        res = broker.cli(alice, "session", "checkin", f"{sid}@hostR")
        assert res.returncode == 0, res.stderr
        out, err = waiter.communicate(timeout=HANG_S)
        assert waiter.returncode == 0, err
        got = json.loads(out)
        assert got["host"] == "hostR" and got["session"]["user"] == bob.name
        events = [e for e in remote.audit_events() if e.get("event") == "checkout"]
        assert events and events[-1]["user"] == bob.name
