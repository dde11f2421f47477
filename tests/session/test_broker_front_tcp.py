"""Researchers on other hosts reach the broker over TCP with munge: no broker socket on their host,
only institution.yaml's broker address. The broker and "their host" run their own munged with one
key. Forged, replayed, changed, misdirected and impersonating requests are refused, one audit line each.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.waits import HANG_S

from .conftest import CLI, User
from .institution import Broker, institution, stand_in_ssh
from .munged import Munged, start_munged, stop_munged

pytestmark = pytest.mark.skipif(shutil.which("munged") is None, reason="munge is not installed")

# A user's own process making crafted requests: each line of stdout is the broker's answer to one.
ATTACKS = r"""
import json, os, pwd, socket, sys
from calque.models.institution import binding
from calque.session import munge

port, target, victim, msock = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
me = pwd.getpwuid(os.getuid()).pw_name

def env(op, args, rid, host, user, as_user=None, cred=None):
    cred = cred or munge.encode(binding(op, args, rid, host, user, as_user), socket=msock)
    return {"version": 1, "op": op, "args": args, "request_id": rid, "host": host, "user": user,
            "as_user": as_user, "credential": cred}

def send(body):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall((body if isinstance(body, bytes) else json.dumps(body).encode()) + b"\n")
        data = b""
        while True:  # the broker closes after its answer and the seal line
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    answer, seal = data.split(b"\n")[:2]
    print(json.dumps({"answer": json.loads(answer), "sealed": seal.startswith(b"MUNGE:")}), flush=True)

send(env("queue", {}, "forged-0001", target, me, cred="MUNGE:" + "A" * 120 + ":"))
ok = env("queue", {}, "replay-0001", target, me)
send(ok)
send(ok)  # the same credential again
send(env("queue", {}, "otherhost-1", "hostA", me))  # made for a host daemon, sent to the broker
send(env("queue", {"all": True}, "victim-0001", target, victim, cred=munge.encode(
    binding("queue", {"all": True}, "victim-0001", target, victim, None), socket=msock)))  # names another user
changed = env("queue", {}, "changed-001", target, me)
changed["args"] = {"all": True}
send(changed)
send(env("queue", {}, "asuser-0001", target, me, as_user=victim))
send(b"not json at all")
"""


def _tcp(broker: Broker, researchers: Munged) -> None:
    """The CLI on "another host": no broker socket, institution.yaml names the broker over TCP."""
    env = {
        **broker.env,
        "CALQUE_BROKER_SOCKET": str(broker.dir / "absent.sock"),
        "CALQUE_INSTITUTION": str(broker.dir / "institution.yaml"),
        "CALQUE_MUNGE_SOCKET": str(researchers.socket),
    }
    broker.cli_env = lambda: env  # type: ignore[method-assign]


def _audit(broker: Broker) -> list[dict[str, Any]]:
    path = broker.dir / "audit/broker-audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_anywhere_queue_and_checkin_over_tcp_and_every_forgery_refused_and_audited(
    make_user: Callable[..., User],
) -> None:
    with institution(make_user, {"hostA": 1, "hostB": 1}) as broker:
        (broker.dir / "munge").mkdir()
        (broker.dir / "munge-researchers").mkdir()
        brokers = start_munged(broker.dir / "munge", key=broker.munge_key())  # the hosts' nudges decode
        researchers = start_munged(broker.dir / "munge-researchers", key=brokers.key.read_bytes())
        try:
            broker.write_institution(broker={"name": "front", "address": "127.0.0.1", "port": broker.port})
            (broker.dir / "institution.yaml").chmod(0o644)
            broker.config.update(
                munge_socket=str(brokers.socket),
                audit_log=str(broker.dir / "audit/broker-audit.jsonl"),
                poll_every=3600,  # after its first look, the broker lists a host only when told it changed
            )
            broker.start()
            _tcp(broker, researchers)
            alice, bob, carol = make_user(), make_user(), make_user()

            grants = [broker.anywhere(u) for u in (alice, bob)]
            assert {g["host"] for g in grants} == {"hostA", "hostB"}
            assert [g["session"]["user"] for g in grants] == [alice.name, bob.name]

            waiter = broker.popen(carol, "session", "checkout", "--anywhere", "--wait", "--ttl", "1h", "--json")
            deadline = time.monotonic() + HANG_S
            mine: list[Any] = []
            while time.monotonic() < deadline and not mine:
                res = broker.cli(carol, "session", "queue", "--json")
                assert res.returncode == 0, res.stderr
                mine = json.loads(res.stdout)
                time.sleep(0.1)
            assert mine and mine[0]["user"] == carol.name and mine[0]["position"] == 1, mine
            # bob may neither see nor cancel carol's request over TCP either
            res = broker.cli(bob, "session", "queue", "--cancel", mine[0]["id"])
            assert res.returncode == 4, res.stderr

            ref = f"{grants[0]['session']['id']}@{grants[0]['host']}"
            res = broker.cli(bob, "session", "checkin", ref)
            assert res.returncode == 4 and "not yours" in res.stderr, res.stderr
            res = broker.cli(alice, "session", "checkin", ref, "--json")
            assert res.returncode == 0, res.stderr
            # Granted on the check-in itself (the host's nudge, the broker's own look): no poll comes in time.
            out, err = waiter.communicate(timeout=HANG_S)
            assert waiter.returncode == 0, err
            assert json.loads(out)["host"] == grants[0]["host"]
            assert _audit(broker) == [], "honest requests wrote refusals"

            att = broker.popen_script(alice, ATTACKS, str(broker.port), "front", bob.name, str(researchers.socket))
            out, err = att.communicate(timeout=HANG_S)
            assert att.returncode == 0, err
            lines = [json.loads(line) for line in out.splitlines()]
            answers = [line["answer"] for line in lines]
            assert all(line["sealed"] for line in lines), lines  # refusals are sealed answers too
            assert [a["ok"] for a in answers] == [False, True, False, False, False, False, False, False], answers
            refused = _audit(broker)
            reasons = [e["reason"] for e in refused]
            assert reasons == [
                "credential_bad",
                "credential_replayed",
                "other_host",
                "uid_mismatch",
                "payload_mismatch",
                "acts_for_another",
                "protocol",
            ], refused
            assert all(e["event"] == "remote_refused" and e["peer"].startswith("127.0.0.1:") for e in refused)
            assert {e.get("credential_uid") for e in refused[2:6]} == {alice.uid}  # decoded: munge named alice
            assert bob.name in answers[4]["error"]["message"] and str(alice.uid) in answers[4]["error"]["message"]
            # the broker served on: its queue still answers over TCP
            assert broker.cli(bob, "session", "queue", "--json").returncode == 0
        finally:
            broker.stop()
            stop_munged(researchers)
            stop_munged(brokers)


# A user's own "broker" on the broker's port: answers every request ok, sealed by its own process.
FAKE_BROKER = r"""
import json, socket, sys
from calque.session import munge
from calque.session.signed import seal

port, msock, sign = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "sign"
srv = socket.create_server(("127.0.0.1", port))
print("ready", flush=True)
for _ in range(2):
    conn, _ = srv.accept()
    req = json.loads(conn.makefile("rb").readline())
    line = json.dumps({"version": 1, "ok": True, "result": []}).encode()
    conn.sendall(line + b"\n" + (seal(req["request_id"], line, munge_socket=msock) if sign else b""))
    conn.close()
"""


REMOTE_CALL = r"""
import sys
from pathlib import Path
from calque.session.remote import RemoteHost

try:
    host = RemoteHost("hostX", "127.0.0.1", int(sys.argv[1]), Path(sys.argv[2]), retry_for=0)
    host.call("status", request_id="q" * 16)
    print("believed")
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_an_answer_not_sealed_by_the_brokers_user_is_not_believed(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"hostA": 1}) as broker:
        broker.write_institution(broker={"name": "front", "address": "127.0.0.1", "port": broker.port})
        (broker.dir / "institution.yaml").chmod(0o644)
        broker.config.update(tcp_addr=None)  # the real broker is not on TCP: the port is mallory's
        broker.start()
        (broker.dir / "m").mkdir()
        m = start_munged(broker.dir / "m")
        try:
            _tcp(broker, m)
            alice, mallory = make_user(), make_user()
            res = broker.cli(alice, "session", "queue")
            assert res.returncode == 6 and "front (127.0.0.1:" in res.stderr, res.stderr
            for how, expect in (("sign", "not as its service user root"), ("bare", "no seal")):
                fake = broker.popen_script(mallory, FAKE_BROKER, str(broker.port), str(m.socket), how)
                try:
                    assert fake.stdout is not None and fake.stdout.readline().strip() == "ready"
                    res = broker.cli(alice, "session", "queue")
                    assert res.returncode == 4 and expect in res.stderr, res.stderr
                    # a host daemon's answers likewise: RemoteHost (the broker's link) believes root's seal only
                    call = broker.popen_script(alice, REMOTE_CALL, str(broker.port), str(m.socket))
                    out, err = call.communicate(timeout=HANG_S)
                    assert out.startswith("RefusedError") and expect in out, (out, err)
                finally:
                    fake.kill()
                    fake.wait(10)
        finally:
            stop_munged(m)


def test_run_and_shell_anywhere_go_to_the_granted_host_over_ssh(make_user: Callable[..., User]) -> None:
    import subprocess

    from .conftest import as_user

    with institution(make_user, {"hostA": 1, "hostB": 1}) as broker:
        broker.write_institution()
        broker.start()
        alice, bob = make_user(), make_user()
        env, log = stand_in_ssh(broker)

        def calque(user: User, *args: str) -> subprocess.CompletedProcess[str]:
            cmd = as_user(user, [*broker.python, "-c", CLI, *args])
            return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_S, cwd=broker.dir)

        script = 'echo "$CALQUE_SESSION_ID $CUDA_VISIBLE_DEVICES"'
        res = calque(alice, "session", "run", "--anywhere", "--ttl", "1h", "--", "/bin/sh", "-c", script)
        assert res.returncode == 0, res.stderr
        sid, visible = res.stdout.split()
        told = next(line.split() for line in res.stderr.splitlines() if line.startswith("session "))
        ref, slice_id = told[1], told[2]
        assert ref.startswith(f"{sid}@") and ref.endswith(":")
        host = ref[:-1].split("@", 1)[1]
        assert host in broker.hosts and visible == slice_id, (res.stdout, res.stderr)
        called = log.read_text().splitlines()
        assert called == [f"-t {host} calque session run --session {sid} -- /bin/sh -c '{script}'"], called

        # the session named with its host: the same path, no new checkout; bob cannot enter it
        res = calque(alice, "session", "run", "--session", f"{sid}@{host}", "--", "/bin/true")
        assert res.returncode == 0, res.stderr
        res = calque(bob, "session", "run", "--session", f"{sid}@{host}", "--", "/bin/true")
        assert res.returncode == 4 and "not yours" in res.stderr, res.stderr
        res = calque(bob, "session", "shell", "--profile", "1g.5gb")
        assert res.returncode == 2 and "--anywhere" in res.stderr, res.stderr
