"""Enforcement first: no client, however many connections it opens, delays another user or an expiry.

Mallory floods the session socket (1,000 idle connections, reopened as the daemon drops them) or the
metrics port; Alice's checkout still answers and Carol's expiring session still ends, both while the
flood goes on (it lasts until the test ends it), so neither waited for it to stop. How fast they are
under a flood is a timing goal (bench/), not a test's.
"""

from __future__ import annotations

import json
import socket
import subprocess
import textwrap
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

import pytest
from support.waits import HANG_S

from .conftest import Host, User, as_user, wait_for

pytestmark = pytest.mark.slow

# Holds N idle connections to a unix socket path or a 127.0.0.1 TCP port; reopens each one the
# server closes, until the time is up.
FLOOD = textwrap.dedent(
    """
    import resource, selectors, socket, sys, time
    target, n, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sel = selectors.DefaultSelector()
    def one():
        if target.isdigit():
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            addr = ("127.0.0.1", int(target))
        else:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            addr = target
        s.setblocking(False)
        err = s.connect_ex(addr)
        if err not in (0, 115, 11):  # EINPROGRESS, EAGAIN (a full backlog): keep it, it may connect
            s.close()
            return
        sel.register(s, selectors.EVENT_READ)
    while len(sel.get_map()) < n:
        one()
    print("ready", flush=True)
    end = time.time() + secs
    while time.time() < end:
        for key, _ in sel.select(0.05):
            sel.unregister(key.fileobj)
            key.fileobj.close()
        while len(sel.get_map()) < n:
            one()
    """
)

# One checkout as the calling user, not retried.
CHECKOUT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from calque.session.client.connection import SessionClient
    c = SessionClient(Path(sys.argv[1]), retry_for=0)
    s = c.call("checkout", ttl="10m")
    print(json.dumps({"id": s["id"]}))
    """
)


@contextmanager
def _flood(host: Host, user: User, target: str, n: int) -> Iterator[subprocess.Popen[str]]:
    """Mallory's flood, from ready until the end of the block (it outlasts any wait of the test)."""
    p = subprocess.Popen(
        as_user(user, ["/usr/bin/python3", "-c", FLOOD, target, str(n), str(4 * HANG_S)]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield p
    finally:
        p.kill()
        p.wait()


def _checkout(host: Host, user: User) -> str:
    res = host.run_as(user, [*host.python, "-c", CHECKOUT, str(host.socket)], check=True)
    return str(json.loads(res.stdout)["id"])


def _ended_late_by(host: Host, session: dict[str, str]) -> float:
    assert wait_for(lambda: any(e["session"] == session["id"] for e in host.audit_events() if e["event"] == "expiry"))
    end = next(e for e in host.audit_events() if e["session"] == session["id"] and e["event"] == "expiry")
    return datetime.fromisoformat(end["ts"]).timestamp() - datetime.fromisoformat(session["expires_at"]).timestamp()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_one_users_idle_connections_cannot_starve_another(host: Host, make_user: Callable[..., User]) -> None:
    mallory, alice, carol = make_user(), make_user(), make_user()
    # Mallory's idle connections are never timed out (an hour): no thread or turn of the daemon is
    # freed by dropping them, so a request served at all was served beside them, not after them.
    host.start(request_timeout=3600, kill_grace=0.2)
    with _flood(host, mallory, str(host.socket), 1000) as flood:
        expiring = json.loads(host.cli(carol, "session", "checkout", "--ttl", "4s", "--json", check=True).stdout)
        assert _checkout(host, alice), "Alice's checkout was not served beside Mallory's connections"
        late = _ended_late_by(host, expiring)
        assert late >= 0, f"Carol's session ended {-late:.2f} s before its deadline"
        # Mallory herself is told why her connections beyond the limit are refused.
        res = host.run_as(mallory, [*host.python, "-c", CHECKOUT, str(host.socket)])
        assert res.returncode != 0 and "connections open" in res.stderr, res.stderr
        assert flood.poll() is None, "the flood ended before the test did: what it proves was not under a flood"
    assert host.proc is not None and host.proc.poll() is None


def test_metrics_flood_cannot_delay_expiry(host: Host, make_user: Callable[..., User]) -> None:
    mallory, alice, carol = make_user(), make_user(), make_user()
    port = _free_port()
    host.start(metrics_port=port, kill_grace=0.2)
    assert wait_for(lambda: _scrape(port) is not None)
    with _flood(host, mallory, str(port), 1000) as flood:
        expiring = json.loads(host.cli(carol, "session", "checkout", "--ttl", "4s", "--json", check=True).stdout)
        assert _checkout(host, alice), "Alice's checkout was not served during the metrics flood"
        late = _ended_late_by(host, expiring)
        assert late >= 0, f"Carol's session ended {-late:.2f} s before its deadline"
        assert flood.poll() is None, "the flood ended before the test did: what it proves was not under a flood"
    # The flood over, the metrics server answers again (it was bounded, not broken).
    assert wait_for(lambda: (_scrape(port) or "").find("calque_session_slices") >= 0)


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return str(r.read().decode())
    except OSError:
        return None
