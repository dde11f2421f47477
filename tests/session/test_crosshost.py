"""Requests across hosts: a real munged with a test key, a real daemon listening on 127.0.0.1, real
second Unix users making their own credentials, and the attacker's moves (a forged credential, a
replayed one, one made for another host, one naming another user, a body changed after signing, a
uid that differs by name): each refused with a clear error and an audit record."""

from __future__ import annotations

import contextlib
import json
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from calque.session import munge
from support.waits import HANG_S

from .conftest import Host, User
from .munged import Munged, start_munged, stop_munged

pytestmark = pytest.mark.slow

HOST = "teach-1"

ENVELOPE = """
import json, sys
from pathlib import Path
from calque.session.remote import RemoteHost
a = json.loads(sys.argv[1])
h = RemoteHost(a["host"], "127.0.0.1", a["port"], Path(a["socket"]))
env = h.envelope(a["op"], a["args"], request_id=a["rid"], as_user=a["as_user"], user=a["user"])
print(env.model_dump_json())
"""

CALL = """
import json, sys
from pathlib import Path
from calque.errors import CalqueError
from calque.session.remote import RemoteHost
a = json.loads(sys.argv[1])
h = RemoteHost(a["host"], "127.0.0.1", a["port"], Path(a["socket"]))
try:
    print(json.dumps({"ok": h.call(a["op"], a["args"], request_id=a["rid"], as_user=a["as_user"])}))
except CalqueError as e:
    print(json.dumps({"error": type(e).__name__, "exit": e.exit_code, "message": str(e)}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Door:
    """The daemon's TCP side, and users making requests to it from their own processes."""

    def __init__(
        self, host: Host, m: Munged, broker_user: str = "root", hub_user: str | None = None, **config: Any
    ) -> None:
        self.host, self.munged, self.port = host, m, _free_port()
        # No broker runs beside these hosts: past a moment's silence the host is in degraded mode and
        # serves a user's own checkout directly, which is what these tests of credentials need. While
        # a broker answers, the door refuses it (the last test below; test_queue_door.py).
        config.setdefault("degraded_after", 0.001)
        inst = host.dir / "institution.yaml"
        inst.write_text(
            yaml.safe_dump(
                {
                    "version": 1,
                    "hosts": [{"name": HOST, "address": "127.0.0.1", "port": self.port, "offers": ["1g.5gb"]}],
                    "broker": {"address": "127.0.0.1", "port": 7460, "service_user": broker_user},
                    **({"hub": {"service_user": hub_user}} if hub_user else {}),
                }
            )
        )
        host.start(
            listen_tcp={"address": "127.0.0.1", "port": self.port},
            host_name=HOST,
            institution=str(inst),
            munge_socket=str(m.socket),
            **config,
        )

    def _args(self, op: str, args: dict[str, Any], rid: str, as_user: str | None, user: str | None, to: str) -> str:
        a = {"host": to, "port": self.port, "socket": str(self.munged.socket), "op": op, "args": args}
        return json.dumps({**a, "rid": rid, "as_user": as_user, "user": user})

    def envelope(
        self,
        who: User | None,
        op: str,
        args: dict[str, Any] | None = None,
        *,
        as_user: str | None = None,
        user: str | None = None,
        to: str = HOST,
        rid: str = "r" * 16,
    ) -> dict[str, Any]:
        """The wire envelope ``who``'s own process makes (its credential vouches for its uid)."""
        cmd = [*self.host.python, "-c", ENVELOPE, self._args(op, args or {}, rid, as_user, user, to)]
        res = self.host.run_as(who, cmd, check=True)
        doc: dict[str, Any] = json.loads(res.stdout)
        return doc

    def call(self, who: User | None, op: str, args: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        cmd = [
            *self.host.python,
            "-c",
            CALL,
            self._args(op, args or {}, kw.get("rid", "c" * 16), kw.get("as_user"), None, HOST),
        ]
        res = self.host.run_as(who, cmd, check=True)
        doc: dict[str, Any] = json.loads(res.stdout)
        return doc

    def send(self, raw: bytes) -> dict[str, Any]:
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(raw)
            buf = b""
            with contextlib.suppress(ConnectionResetError):  # refused unread, the rest of a request resets
                while buf.count(b"\n") < 2:  # the answer, then its seal (a credential of the daemon's)
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
        answer, _, seal = buf.partition(b"\n")
        doc: dict[str, Any] = json.loads(answer)
        # every answer the daemon's service gave is sealed, refusals too; only the front door's own
        # (a request too large, too many connections), given before any request is read, is not
        assert seal.startswith(b"MUNGE:") or "larger than" in doc["error"]["message"], buf
        return doc

    def send_envelope(self, env: dict[str, Any]) -> dict[str, Any]:
        return self.send(json.dumps(env).encode() + b"\n")

    def refusals(self) -> list[dict[str, Any]]:
        return [e for e in self.host.audit_events() if e["event"] == "remote_refused"]


def _refused(answer: dict[str, Any], *words: str) -> str:
    assert answer["ok"] is False, answer
    assert answer["error"]["kind"] == "forbidden", answer
    message: str = answer["error"]["message"]
    for w in words:
        assert w in message, message
    return message


def test_munge_round_trip_replay_and_forgery(munged: Munged) -> None:
    cred = munge.encode(b"payload", socket=munged.socket)
    got = munge.decode(cred, socket=munged.socket)
    assert (got.uid, got.gid, got.payload) == (0, 0, b"payload") and got.encoded_at > 0
    with pytest.raises(munge.MungeError) as replay:
        munge.decode(cred, socket=munged.socket)
    assert replay.value.reason == "replayed" and replay.value.exit_code == 4
    forged = cred[:20] + ("A" if cred[20] != "A" else "B") + cred[21:]
    with pytest.raises(munge.MungeError) as bad:
        munge.decode(forged, socket=munged.socket)
    assert bad.value.reason == "bad"
    with pytest.raises(munge.MungeError):
        munge.decode("not a credential \u00e9", socket=munged.socket)


def test_an_expired_credential_is_refused(munged: Munged) -> None:
    cred = munge.encode(b"x", socket=munged.socket, ttl=1)
    time.sleep(2.5)
    with pytest.raises(munge.MungeError) as old:
        munge.decode(cred, socket=munged.socket)
    assert old.value.reason == "expired"


def test_a_credential_made_with_another_key_is_refused(munged: Munged) -> None:
    other = start_munged(Path(tempfile.mkdtemp(prefix="calque-munge-", dir="/tmp")))
    try:
        cred = munge.encode(b"x", socket=other.socket)
    finally:
        stop_munged(other)
    with pytest.raises(munge.MungeError) as bad:
        munge.decode(cred, socket=munged.socket)
    assert bad.value.reason == "bad"


def test_a_user_reaches_the_daemon_as_herself_and_no_one_else(
    host: Host, munged: Munged, make_user: Callable[..., User]
) -> None:
    alice, bob = make_user(), make_user()
    door = Door(host, munged)

    who = door.call(alice, "whoami")
    assert who["ok"]["uid"] == alice.uid and who["ok"]["user"] == alice.name and who["ok"]["pid"] == 0
    s = door.call(alice, "checkout", {"profile": "1g.5gb", "ttl": "1h"}, rid="a" * 16)["ok"]
    assert s["user"] == alice.name and s["uid"] == alice.uid
    again = door.call(alice, "checkout", {"profile": "1g.5gb", "ttl": "1h"}, rid="a" * 16)["ok"]
    assert again["id"] == s["id"]  # the same request id: the same grant, not a second slice

    # Alice's own credential can never name another user.
    env = door.envelope(alice, "checkout", {"profile": "1g.5gb"}, as_user=bob.name)
    _refused(door.send_envelope(env), alice.name, bob.name, "broker")
    # Claiming to be bob: bob's uid here is not the credential's: both named.
    env = door.envelope(alice, "whoami", user=bob.name)
    _refused(door.send_envelope(env), bob.name, str(bob.uid), str(alice.uid))
    # Through the client, the refusal keeps its exit code.
    answer = door.call(alice, "checkout", {"profile": "1g.5gb"}, as_user=bob.name)
    assert answer["error"] == "RefusedError" and answer["exit"] == 4

    reasons = [e["reason"] for e in door.refusals()]
    assert reasons.count("acts_for_another") == 2 and "uid_mismatch" in reasons
    assert all(e["credential_uid"] == alice.uid for e in door.refusals())


def test_forged_replayed_other_host_and_changed_body_are_refused_and_audited(
    host: Host, munged: Munged, make_user: Callable[..., User]
) -> None:
    alice = make_user()
    door = Door(host, munged)

    env = door.envelope(alice, "status")
    assert door.send_envelope(env)["ok"] is True
    _refused(door.send_envelope(env), "replayed")  # the same credential a second time

    env = door.envelope(alice, "status")
    c = env["credential"]
    env["credential"] = c[:30] + ("A" if c[30] != "A" else "B") + c[31:]
    _refused(door.send_envelope(env), "bad munge credential")

    env = door.envelope(alice, "status", to="teach-2")
    _refused(door.send_envelope(env), "teach-2", HOST)

    env = door.envelope(alice, "checkout", {"profile": "1g.5gb", "ttl": "10m"})
    env["args"]["ttl"] = "8h"
    _refused(door.send_envelope(env), "changed after signing")

    env = door.envelope(alice, "adopt")
    answer = door.send_envelope(env)
    assert answer["error"]["kind"] == "usage" and "ssh -t" in answer["error"]["message"]

    reasons = [e["reason"] for e in door.refusals()]
    for r in ("credential_replayed", "credential_bad", "other_host", "payload_mismatch", "needs_local_process"):
        assert r in reasons, reasons
    assert all(e.get("user") == alice.name for e in door.refusals())
    assert not [e for e in host.audit_events() if e["event"] == "checkout"]  # nothing was granted


def test_the_broker_acts_for_a_user_and_a_user_named_broker_does_not(
    host: Host, munged: Munged, make_user: Callable[..., User]
) -> None:
    alice, broker = make_user(), make_user()
    door = Door(host, munged, broker_user=broker.name, degraded_after=HANG_S)

    s = door.call(broker, "checkout", {"profile": "1g.5gb", "ttl": "1h"}, as_user=alice.name)["ok"]
    assert s["user"] == alice.name and s["uid"] == alice.uid  # the session is alice's, not the broker's
    # The broker answers: alice's own checkout over TCP is refused, naming the command that queues.
    mine = door.call(alice, "checkout", {"profile": "1g.5gb", "ttl": "1h"})
    assert mine["exit"] == 4 and "institution's queue" in mine["message"], mine
    assert [e["door"] for e in host.audit_events() if e["event"] == "checkout"] == ["broker"]
    # Root is not the broker here: it may not act for alice over TCP either.
    env = door.envelope(None, "status", as_user=alice.name)
    _refused(door.send_envelope(env), broker.name)
    # Alice claiming the broker's name: the credential's uid is hers.
    env = door.envelope(alice, "status", as_user=alice.name, user=broker.name)
    _refused(door.send_envelope(env), str(broker.uid), str(alice.uid))


def test_garbage_on_the_tcp_port_leaves_the_daemon_serving(
    host: Host, munged: Munged, make_user: Callable[..., User]
) -> None:
    alice = make_user()
    door = Door(host, munged, max_tcp_connections=4, processes=1)  # the bound is per process
    for raw in (b"not json\n", b"\xff\xfe\n", b'{"op": "status"}\n', b"[]\n", b'{"version": 99}\n'):
        answer = door.send(raw)
        assert answer["ok"] is False and answer["error"]["kind"] in ("forbidden", "protocol"), answer
    big = door.send(b"x" * (host.config.get("max_request_bytes", 64 * 1024) + 10))
    assert big["error"]["kind"] == "protocol" and "larger than" in big["error"]["message"]
    with socket.create_connection(("127.0.0.1", door.port), timeout=10) as s:
        s.sendall(b'{"op": "sta')  # cut off: the request timeout ends it, not the daemon
        assert b"not complete within" in s.recv(4096)
    # One address holds at most max_tcp_connections idle connections per process; the next is refused.
    idle = [socket.create_connection(("127.0.0.1", door.port), timeout=10) for _ in range(4)]
    try:
        with socket.create_connection(("127.0.0.1", door.port), timeout=10) as s:
            s.sendall(b"{}\n")
            assert b"connections open" in s.recv(4096)
    finally:
        for c in idle:
            c.close()
    assert door.call(alice, "whoami")["ok"]["uid"] == alice.uid
