"""Requests from other hosts: a real daemon's TCP port on 127.0.0.1, real munged processes (the
daemon's own, and a forger's with another key), real second Unix users making their own credentials.
Every refusal is answered and audited, and the daemon keeps serving."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from calque.errors import RefusedError, UsageError
from calque.models.crossing import CrossingRequest, binding
from calque.session import munge
from calque.session.remote import RemoteHost

from .conftest import CLI, Host, User
from .munged import Munged, munged, new_key

pytestmark = pytest.mark.skipif(shutil.which("munged") is None, reason="munge is not installed")

# Run as a test user: the request line that user's own process makes (its own munge credential).
# argv: munge socket, host, port, op, args JSON, request id, as_user or "", user name claimed or "".
MAKE_LINE = """
import json, sys
from pathlib import Path
from calque.models.crossing import CrossingRequest, binding
from calque.session import munge
from calque.session.remote import RemoteHost, _me
sock, host, port, op, args, rid, as_user, user = sys.argv[1:9]
args = json.loads(args)
as_user = as_user or None
user = user or _me()
cred = munge.encode(binding(op, args, rid, host, as_user, user), socket=Path(sock))
req = CrossingRequest(op=op, args=args, request_id=rid, host=host, user=user, as_user=as_user, credential=cred)
sys.stdout.write(req.model_dump_json(exclude_none=True))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def md() -> Iterator[Munged]:
    with munged() as m:
        yield m


@pytest.fixture
def tcp_host(host: Host, md: Munged) -> Iterator[tuple[Host, RemoteHost]]:
    port = free_port()
    host.start(host_name="hostA", listen_tcp={"address": "127.0.0.1", "port": port}, munge_socket=str(md.socket))
    yield host, RemoteHost("hostA", "127.0.0.1", port, md.socket)


def line_as(
    h: Host, maker: User, md: Munged, link: RemoteHost, op: str, args: dict[str, Any], rid: str, **kw: str
) -> bytes:
    argv = [str(md.socket), kw.get("host", "hostA"), str(link.port), op, json.dumps(args), rid]
    argv += [kw.get("as_user", ""), kw.get("claim", "")]
    res = h.run_as(maker, [*h.python, "-c", MAKE_LINE, *argv], check=True)
    return res.stdout.encode() + b"\n"


def refusals(h: Host) -> list[dict[str, Any]]:
    return [e for e in h.audit_events() if e["event"] == "crossing_refused"]


def checkout_args(rid: str) -> dict[str, Any]:
    return {"ttl": "1h", "profile": "1g.5gb", "request_id": rid}


def test_the_brokers_uid_acts_for_a_user_and_the_session_is_theirs(
    tcp_host: tuple[Host, RemoteHost], make_user: Callable[..., User]
) -> None:
    h, link = tcp_host
    alice = make_user()
    got = link.call("checkout", checkout_args("r-alice-0001"), request_id="r-alice-0001", as_user=alice.name)
    assert got["user"] == alice.name and got["uid"] == alice.uid
    # the host's own socket agrees: the session is alice's there
    status = h.cli(alice, "session", "status", "--json", check=True)
    assert got["id"] in status.stdout
    # a retry of the same request id (a new credential) takes no second slice
    again = link.call("checkout", checkout_args("r-alice-0001"), request_id="r-alice-0001", as_user=alice.name)
    assert again["id"] == got["id"]
    assert not refusals(h)


def test_a_user_acts_for_herself_but_her_credential_never_names_another_user(
    tcp_host: tuple[Host, RemoteHost], md: Munged, make_user: Callable[..., User]
) -> None:
    h, link = tcp_host
    alice, bob = make_user(), make_user()
    own = line_as(h, alice, md, link, "checkout", checkout_args("r-own-00001"), "r-own-00001")
    got = link.send(own)
    assert got["uid"] == alice.uid
    line = line_as(h, alice, md, link, "checkout", checkout_args("r-forbob-01"), "r-forbob-01", as_user=bob.name)
    with pytest.raises(RefusedError, match=f"{alice.name} may not act for {bob.name}"):
        link.send(line)
    [ev] = refusals(h)
    assert ev["reason"] == "not_broker" and ev["uid"] == alice.uid and ev["as_user"] == bob.name
    assert not [s for s in h.client().list_slices() if s.holder == bob.name]


def test_a_user_name_whose_uid_here_differs_from_the_credentials_is_refused_naming_both(
    tcp_host: tuple[Host, RemoteHost], md: Munged, make_user: Callable[..., User]
) -> None:
    h, link = tcp_host
    alice, bob = make_user(), make_user()
    line = line_as(h, alice, md, link, "status", {}, "r-claim-bob", claim=bob.name)
    with pytest.raises(RefusedError) as exc:
        link.send(line)
    msg = str(exc.value)
    assert f"user {bob.name} has uid {bob.uid}" in msg and f"credential is uid {alice.uid} ({alice.name} here)" in msg
    [ev] = refusals(h)
    assert ev["reason"] == "uid_mismatch" and ev["user"] == bob.name


def test_forged_replayed_other_host_and_changed_bodies_are_refused_and_audited(
    tcp_host: tuple[Host, RemoteHost], md: Munged, make_user: Callable[..., User]
) -> None:
    h, link = tcp_host
    alice = make_user()
    # forged: a credential from a munged with another key
    with munged(new_key(md.dir / "forger.key")) as forger:
        forged = RemoteHost("hostA", "127.0.0.1", link.port, forger.socket)
        with pytest.raises(RefusedError, match="munge credential refused"):
            forged.call("status", {}, request_id="r-forged-01", as_user=alice.name)
    # replayed: the same line twice
    line = link.request("status", {}, request_id="r-replay-01", as_user=alice.name)
    assert link.send(line) == []
    with pytest.raises(RefusedError, match=r"(?i)replay"):
        link.send(line)
    # made for another host, sent here
    other = RemoteHost("hostB", "127.0.0.1", link.port, md.socket)
    with pytest.raises(RefusedError, match="made for host hostB; this is hostA"):
        other.call("status", {}, request_id="r-hostb-001", as_user=alice.name)
    # a body changed after signing: the ttl, then the user acted for
    # (each from a fresh credential: munged takes a credential into its replay cache at the first decode)
    for change in (
        {"args": {**checkout_args("r-change-01"), "ttl": "8h"}},
        {"as_user": alice.name},
        {"request_id": "r-change-02"},
    ):
        signed = json.loads(link.request("checkout", checkout_args("r-change-01"), request_id="r-change-01"))
        with pytest.raises(RefusedError, match="does not match its munge credential"):
            link.send(json.dumps({**signed, **change}).encode() + b"\n")
    # expired: a credential past its time to live (1 s here; munge's default is 5 min)
    rid = "r-expire-01"
    cred = munge.encode(binding("status", {}, rid, "hostA", alice.name, "root"), socket=md.socket, ttl=1)
    late = CrossingRequest(op="status", request_id=rid, host="hostA", user="root", as_user=alice.name, credential=cred)
    time.sleep(2.2)
    with pytest.raises(RefusedError, match=r"(?i)expired"):
        link.send(late.model_dump_json().encode() + b"\n")
    reasons = [e["reason"] for e in refusals(h)]
    assert reasons[0] in ("cred_invalid", "bad_mac")
    assert reasons[1:] == ["cred_replayed", "other_host", "mismatch", "mismatch", "mismatch", "cred_expired"]
    assert not any(s.busy for s in h.client().list_slices())  # none of them checked anything out


def test_adopt_is_refused_over_tcp_with_a_sentence_saying_ssh(tcp_host: tuple[Host, RemoteHost]) -> None:
    _, link = tcp_host
    with pytest.raises(UsageError, match="ssh hostA calque session shell"):
        link.call("adopt", {}, request_id="r-adopt-001")


def test_garbage_on_the_port_gets_errors_and_the_daemon_keeps_serving(
    tcp_host: tuple[Host, RemoteHost], make_user: Callable[..., User]
) -> None:
    _, link = tcp_host
    for junk in (b"garbage\n", b"\xff\xfe\n", b"{}\n", b'{"version": 99, "op": "ping"}\n', b"[" * 100000 + b"\n"):
        with socket.create_connection(("127.0.0.1", link.port), timeout=5) as s:
            s.sendall(junk)
            answer = s.recv(65536)
        assert b'"ok":false' in answer, (junk[:20], answer)
    with socket.create_connection(("127.0.0.1", link.port), timeout=5) as s:  # a line that never ends
        s.sendall(b'{"op": "ping"')
        assert b"not complete within" in s.recv(65536)
    with socket.create_connection(("127.0.0.1", link.port), timeout=5) as s:
        s.close()  # connected and gone
    assert link.call("ping", {}, request_id="r-ping-0001") == {"pong": True}
    assert link.call("list", {}, request_id="r-list-0001")


def test_the_cli_config_check_takes_listen_tcp(host: Host) -> None:
    path: Path = host.write_config(listen_tcp={"address": "127.0.0.1", "port": 7901, "broker_users": ["calque"]})
    res = subprocess.run(
        [*host.python, "-c", CLI, "config", "check", "session", "--file-only", str(path)],
        env=host.env,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    bad = host.write_config(listen_tcp={"address": "not an address", "port": 7901})
    res = subprocess.run(
        [*host.python, "-c", CLI, "config", "check", "session", "--file-only", str(bad)],
        env=host.env,
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0 and "listen_tcp" in res.stderr
