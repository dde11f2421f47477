"""One user or one host never slows the others (issue 39, part 4), against a real broker, real host
daemons and a real munged: connections that send nothing (or a byte a second) from one address do not
keep another user out; a host that stops answering holds no grant on another; a nudge the broker
cannot believe makes it do nothing."""

from __future__ import annotations

import json
import os
import select
import selectors
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest
from calque.models.institution import NUDGE_PREFIX
from calque.session import munge
from calque.session.broker.nudges import NudgeGate
from support.waits import HANG_S

from .conftest import User, wait_for
from .institution import Broker, institution
from .munged import Munged

pytestmark = pytest.mark.skipif(shutil.which("munged") is None, reason="munge is not installed")

REQUEST_TIMEOUT_S = 3.0  # the broker's whole-request deadline in these tests


def _hosts(broker: Broker) -> dict[str, dict[str, Any]]:
    """The broker's view of each host (root, on its unix socket)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(HANG_S)
        s.connect(str(broker.socket))
        s.sendall(b'{"version": 1, "op": "hosts", "args": {}}\n')
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
    answer = json.loads(data)
    assert answer["ok"], answer
    return {h["name"]: h for h in answer["result"]}


def _researchers_over_tcp(broker: Broker) -> None:
    """The CLI as on another host: no broker socket; institution.yaml names the broker on TCP."""
    assert broker.munged is not None
    env = {
        **broker.env,
        "CALQUE_BROKER_SOCKET": str(broker.dir / "absent.sock"),
        "CALQUE_INSTITUTION": str(broker.dir / "institution.yaml"),
        "CALQUE_MUNGE_SOCKET": str(broker.munged.socket),
    }
    broker.cli_env = lambda: env  # type: ignore[method-assign]


@contextmanager
def _crowd(port: int, n: int) -> Iterator[list[bytes]]:
    """``n`` connections from 127.0.0.1 that never send a byte, each one the broker closes opened
    again at once (a user keeping a crowd up); yields what the closed ones read before closing."""
    heard: list[bytes] = []
    stop = threading.Event()

    def keep() -> None:
        sel = selectors.DefaultSelector()
        while not stop.is_set():
            while len(sel.get_map()) < n and not stop.is_set():
                with suppress(OSError):
                    sel.register(socket.create_connection(("127.0.0.1", port), timeout=HANG_S), selectors.EVENT_READ)
                time.sleep(0.005)  # at most ~200 new connections a second
            for key, _ in sel.select(0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    heard.append(sock.recv(4096))
                except OSError as exc:
                    heard.append(f"reset: {exc}".encode())
                sel.unregister(sock)
                sock.close()
        for key in list(sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]

    t = threading.Thread(target=keep, daemon=True)
    t.start()
    try:
        yield heard
    finally:
        stop.set()
        t.join(HANG_S)


def _trickle(port: int) -> tuple[threading.Thread, list[bytes]]:
    """One connection from 127.0.0.2 that sends a request one byte a second; what it reads back."""
    heard: list[bytes] = []

    def drip() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=HANG_S, source_address=("127.0.0.2", 0)) as s:
            for b in b'{"version": 1, "op": "ping", "pad": "' + b"x" * 120:
                try:
                    s.sendall(bytes([b]))
                except OSError:
                    break
                r, _, _ = select.select([s], [], [], 1.0)
                if r:
                    break
            s.settimeout(HANG_S)
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            heard.append(data)

    t = threading.Thread(target=drip, daemon=True)
    t.start()
    return t, heard


def test_idle_and_trickling_connections_from_one_address_do_not_stop_another_users_anywhere(
    make_user: Callable[..., User],
) -> None:
    with institution(make_user, {"hostA": 1}) as broker:
        broker.write_institution(broker={"name": "front", "address": "127.0.0.1", "port": broker.port})
        (broker.dir / "institution.yaml").chmod(0o644)
        broker.config.update(
            audit_log=str(broker.dir / "audit/broker-audit.jsonl"),
            request_timeout=REQUEST_TIMEOUT_S,
            max_connections_per_uid=2,
        )
        broker.start()
        _researchers_over_tcp(broker)
        bob, alice = make_user(), make_user()
        trickler, trickled = _trickle(broker.port)
        with _crowd(broker.port, 200) as heard:
            assert wait_for(lambda: len(heard) >= 1)  # the crowd is up: the broker is closing its oldest
            started = time.monotonic()
            grant = broker.anywhere(bob)  # from 127.0.0.1 too, as another user of that login host
            took = time.monotonic() - started
            assert grant["session"]["user"] == bob.name and grant["host"] == "hostA"
            print(f"bob's --anywhere over TCP answered in {took:.2f} s beside a crowd of 200")
            # the crowd's closed connections each read why, never a reset
            assert all(b"sent no request" in h or b"no complete request" in h for h in heard[:20]), heard[:20]

            # The trickle is closed at its whole-request deadline (not kept by each byte), with a sentence.
            trickler.join(HANG_S)
            assert trickled and b"no complete request (one JSON line) within 3 s" in trickled[0], trickled

        # Limits are per user once a request is read: alice's third connection is refused, in words.
        waiters = [
            broker.popen(alice, "session", "checkout", "--anywhere", "--wait", "--ttl", "1h", "--json")
            for _ in range(2)
        ]
        try:
            assert wait_for(lambda: len([e for e in broker.queue_all() if e["user"] == alice.name]) == 2)
            res = broker.cli(alice, "session", "queue")
            assert res.returncode == 4, res.stderr
            assert "you hold 2 connections to the broker already" in res.stderr and "Traceback" not in res.stderr
            assert broker.cli(bob, "session", "queue").returncode == 0  # another user is not held by hers
        finally:
            for w in waiters:
                w.kill()
                w.communicate(timeout=HANG_S)


def test_a_stopped_host_does_not_hold_a_grant_on_another(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"hostA": 1, "hostB": 1, "hostC": 1}) as broker:
        # A call to a stopped host would take two minutes to fail: a grant elsewhere must not wait for it.
        broker.config.update(poll_every=1.0, host_timeout=120)
        broker.start()
        alice, carol = make_user(), make_user()
        grant = broker.anywhere(alice)
        held = grant["host"]
        stopped = [name for name in broker.hosts if name != held]
        for name in stopped:
            proc = broker.hosts[name].proc
            assert proc is not None
            os.killpg(proc.pid, signal.SIGSTOP)
        try:
            # marked not answering (its list goes on in the background): no grant goes there
            assert wait_for(lambda: all(not _hosts(broker)[n]["reachable"] for n in stopped)), _hosts(broker)
            waiter = broker.popen(carol, "session", "checkout", "--anywhere", "--wait", "--ttl", "1h", "--json")
            assert wait_for(lambda: any(e["user"] == carol.name for e in broker.queue_all()))
            freed = time.monotonic()
            res = broker.hosts[held].cli(alice, "session", "checkin", grant["session"]["id"])
            assert res.returncode == 0, res.stderr
            out, err = waiter.communicate(timeout=HANG_S)
            took = time.monotonic() - freed
            assert waiter.returncode == 0, err
            assert json.loads(out)["host"] == held
            print(f"granted {took:.2f} s after the free, two hosts stopped")
            # granted while both stopped hosts' calls were still in flight (none has failed yet)
            assert not [n for n in stopped if f"host {n} does not answer" in broker.log()], broker.log()[-2000:]
        finally:
            for name in stopped:
                proc = broker.hosts[name].proc
                assert proc is not None
                os.killpg(proc.pid, signal.SIGCONT)


FORGE = r"""
import sys
from pathlib import Path
from calque.session import munge
print(munge.encode(sys.argv[1].encode(), socket=Path(sys.argv[2])), flush=True)
"""


def test_forged_replayed_and_flooding_nudges_change_nothing(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"hostA": 1, "hostB": 1}) as broker:
        assert broker.munged is not None
        msock = broker.munged.socket
        for h in broker.hosts.values():
            h.stop()
            h.config["broker_nudge"] = "127.0.0.1:9"  # the hosts' own nudges are lost: only ours reach the broker
            h.start()
        broker.config.update(poll_every=3600)  # after its first look, the broker lists a host only when nudged
        broker.start()
        bob, mallory = make_user(), make_user()

        def nudge(datagram: bytes) -> None:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(datagram, ("127.0.0.1", broker.port))

        def signed(host: str) -> bytes:
            return munge.encode(NUDGE_PREFIX + host.encode(), socket=msock).encode()

        def seen(host: str) -> str:
            return str(_hosts(broker)[host]["seen_at"])

        def busy(host: str) -> bool:
            return any(s["busy"] for s in _hosts(broker)[host]["slices"])

        grant = broker.anywhere(bob)
        x = grant["host"]
        y = next(n for n in broker.hosts if n != x)
        before = seen(x)
        first = signed(x)
        nudge(first)  # a nudge x's service user made: believed, x listed again
        assert wait_for(lambda: seen(x) != before) and busy(x)
        # bob checks in on x itself: the broker, never told, still shows the slice busy
        res = broker.hosts[x].cli(bob, "session", "checkin", grant["session"]["id"])
        assert res.returncode == 0, res.stderr
        at_x, at_y = seen(x), seen(y)

        made = broker.popen_script(mallory, FORGE, (NUDGE_PREFIX + x.encode()).decode(), str(msock))
        out, err = made.communicate(timeout=HANG_S)
        assert made.returncode == 0, err
        forged = [
            x.encode(),  # the plain name, as nudges were
            out.strip().encode(),  # a real credential naming x, but of a user not x's service user
            munge.encode(x.encode(), socket=msock).encode(),  # root's, but not a nudge's payload
            first,  # replayed
            b"MUNGE:" + b"A" * 200 + b":",
            os.urandom(300),
        ]
        for _ in range(100):  # a flood of each
            for d in forged:
                nudge(d)

        def y_listed() -> bool:  # sent after the flood, read after it: y listed means every forgery was read
            nudge(signed(y))  # again until one gets past the flood's share of the decode rate
            return seen(y) != at_y

        assert wait_for(y_listed, every=0.2)
        assert seen(x) == at_x and busy(x), _hosts(broker)[x]
        assert "dropped a nudge" in broker.log()

        nudge(signed(x))  # a fresh one of x's: the freed slice is seen
        assert wait_for(lambda: not busy(x))


def test_a_flood_of_valid_nudges_is_taken_at_the_hosts_rate(munged: Munged) -> None:
    """Fresh nudges each signed by hostA's service user: the broker takes at most its rate of them (and
    a burst of one second's worth); every one past it is dropped, so a flood costs no list beyond that.
    A host that registers later (elastic) is believed from then on."""
    hosts = {"hostA": "root"}  # the broker's hosts now: an elastic host joins as it registers
    gate = NudgeGate(lambda: hosts, munge_socket=munged.socket, per_host_per_second=5.0)
    creds = [munge.encode(NUDGE_PREFIX + b"hostA", socket=munged.socket).encode() for _ in range(60)]
    started = time.monotonic()
    taken = sum(gate.check(c, "127.0.0.1") == "hostA" for c in creds)
    elapsed = time.monotonic() - started
    assert 1 <= taken <= 5 + 5.0 * elapsed + 1, (taken, elapsed)
    assert gate.dropped["over hostA's rate"] == 60 - taken
    assert gate.check(NUDGE_PREFIX + b"hostA", "127.0.0.1") is None  # not a credential at all
    assert gate.check(munge.encode(NUDGE_PREFIX + b"hostQ", socket=munged.socket).encode(), "x") is None
    assert gate.dropped["names no host of the institution"] == 1
    hosts["hostE"] = "root"  # registered: its nudges are taken from now on, with no restart
    assert gate.check(munge.encode(NUDGE_PREFIX + b"hostE", socket=munged.socket).encode(), "x") == "hostE"
