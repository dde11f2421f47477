"""The enforcement pieces on their own: the fair queue, ACL encoding, cgroup naming, reclaim retry."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from calque.gpu.sim import SimGpu
from calque.models import GpuProcess
from calque.session.daemon.acceptor import TURN, Conn, FairQueue
from calque.session.daemon.cgroup import SessionCgroups
from calque.session.daemon.cleanup import Cleanup
from calque.session.daemon.enforcer import Enforcer
from calque.session.daemon.guard import NodeGuard
from calque.session.daemon.host import Host
from calque.session.daemon.identity import Caller
from calque.session.daemon.isolation import acl_bytes, acl_users
from calque.session.daemon.service import Service
from calque.session.daemon.wire import quick_request
from calque.session.session_config import SessionConfig
from support.waits import HANG_S


def test_fair_queue_serves_uids_round_robin() -> None:
    q = FairQueue()
    assert q.next() is TURN  # held from here on: the rest are requests
    for i in range(5):
        q.stash(1000, (_conn(1000, True), f"mallory-{i}".encode()))
    q.stash(1001, (_conn(1001, True), b"alice"))
    q.stash(1002, (_conn(1002, True), b"carol"))
    order = []
    for _ in range(7):
        item = q.next()
        assert isinstance(item, tuple)
        order.append(item[1].decode())
    assert order == ["mallory-0", "alice", "carol", "mallory-1", "mallory-2", "mallory-3", "mallory-4"]


def _conn(uid: int, quick: bool) -> Conn:
    return Conn(sock=None, pid=1, uid=uid, gid=uid, deadline=0.0, quick=quick)  # type: ignore[arg-type]


def _wait_idle(q: FairQueue, n: int) -> None:
    deadline = time.monotonic() + HANG_S
    while q._idle != n:
        assert time.monotonic() < deadline, f"{n} thread(s) never waited"
        time.sleep(0.001)


def test_the_turn_holder_serves_a_quick_request_itself_and_passes_the_turn_with_a_slow_one() -> None:
    q = FairQueue()
    assert q.next() is TURN  # the first thread to ask holds the turn
    assert q.after_batch() == (None, True)  # nothing read: keep the turn
    quick = (_conn(1000, True), b"checkout")
    q.stash(1000, quick)
    assert q.after_batch() == (quick, True)  # served by the holder, which keeps the turn
    slow = (_conn(1000, False), b"adopt")
    q.stash(1000, slow)
    assert q.after_batch() == (None, True)  # nobody idle to take the turn: the request waits
    got: list[object] = []

    def take_two() -> None:
        for _ in range(2):
            got.append(q.next())

    other = threading.Thread(target=take_two)
    other.start()
    deadline = time.monotonic() + HANG_S
    while not got:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert got == [slow]  # a thread done serving takes the waiting request
    _wait_idle(q, 1)
    slow2 = (_conn(1001, False), b"adopt")
    q.stash(1001, slow2)
    assert q.after_batch() == (slow2, False)  # the holder serves it, the idle thread takes the turn
    other.join(HANG_S)
    assert got == [slow, TURN]
    assert q.after_batch() == (None, True)


def test_a_closed_queue_releases_every_waiting_thread() -> None:
    q = FairQueue()
    assert q.next() is TURN
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(q.next())) for _ in range(3)]
    for t in threads:
        t.start()
    _wait_idle(q, 3)
    q.close()
    for t in threads:
        t.join(HANG_S)
    assert got == [None, None, None]


def test_only_requests_that_may_wait_on_more_than_the_registry_are_slow() -> None:
    for op in ("adopt", "report", "metrics"):
        assert not quick_request(json.dumps({"v": 1, "op": op, "args": {}}).encode())
    assert not quick_request(b'{"v": 1, "op": "\\u0061dopt", "args": {}}')  # an escape spelling "adopt"
    for op in ("checkout", "checkin", "extend", "status", "list", "release", "ping", "whoami", "nonsense"):
        assert quick_request(json.dumps({"v": 1, "op": op, "args": {}}).encode())
    # garbage is answered with an error at once: quick, and never an exception at the acceptor
    for line in (b"", b"\xff\xfe", b"[" * 100_000, b'"adopt"', b'{"op": ["adopt"]}'):
        assert quick_request(line)


def test_acl_round_trips_through_the_kernel(tmp_path: Path) -> None:
    f = tmp_path / "node"
    f.write_text("")
    try:
        os.setxattr(f, "system.posix_acl_access", acl_bytes(4, {1234: 4, 99: 4}))
    except OSError as exc:
        pytest.skip(f"no POSIX ACLs on {tmp_path}: {exc}")
    assert acl_users(f) == {99: 4, 1234: 4}
    assert f.stat().st_mode & 0o777 == 0o440  # the group bits show the mask; other gets nothing


def test_session_cgroup_names_refuse_anything_but_a_session_id(tmp_path: Path) -> None:
    cg = SessionCgroups("direct", tmp_path)
    assert cg.dir("s-0123abcd") == tmp_path / "s-0123abcd"
    for bad in ("../../etc", "s-0123/../x", "", "S-ABC"):
        assert cg.dir(bad) is None
    (tmp_path / "s-00ff").mkdir()
    (tmp_path / "not-a-session").mkdir()
    assert cg.sessions() == ["s-00ff"]
    off = SessionCgroups.from_config(SessionConfig(cgroups="off"))
    assert off.mode == "off" and off.sessions() == []


class _FailsOnce:
    """A GPU backend whose first process listing fails (NVML does, when the driver is busy)."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.calls = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def processes(self) -> list[GpuProcess]:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("NVML: driver busy")
        return []


@pytest.mark.skipif(os.geteuid() != 0, reason="capability nodes are chowned: run as root")
def test_a_failed_reclaim_is_retried_and_the_session_still_ends(tmp_path: Path) -> None:
    sim = SimGpu.create(tmp_path / "gpus.json", ["A100-40GB"], mig=True, root=tmp_path / "root")
    sim.create_instances(0, ["1g.5gb"])
    cfg = SessionConfig(
        socket=tmp_path / "s.sock",
        db=tmp_path / "sessions.db",
        audit_log=tmp_path / "audit.jsonl",
        gpu_backend="sim",
        sim_state=sim.state_path,
        cgroups="off",
    )
    host = Host.build(cfg)
    reader = _FailsOnce(host.reader)
    host.reader = reader  # type: ignore[assignment]
    cleanup = Cleanup(host)
    service = Service(host, cleanup)
    enforcer = Enforcer(host, cleanup, NodeGuard(host))
    s = service.handle(Caller(pid=os.getpid(), uid=0, gid=0, user="root", admin=True), "checkout", {"ttl": "1s"})
    enforcer.start()
    try:
        deadline = time.monotonic() + HANG_S
        while host.registry.live() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host.registry.live() == [], "the session outlived a failed reclaim"
        assert reader.calls >= 2  # the first attempt failed; a retry ended it
        ended = host.registry.get(s["id"])
        assert ended is not None and ended.session.end_reason == "expired"
    finally:
        enforcer.stop()
        host.close()
