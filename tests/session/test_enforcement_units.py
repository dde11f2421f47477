"""The enforcement pieces on their own: the fair queue, ACL encoding, cgroup naming, reclaim retry."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from calque.gpu.sim import SimGpu
from calque.models import GpuProcess
from calque.session.cgroup import SessionCgroups
from calque.session.config import SessionConfig
from calque.session.daemon import Daemon
from calque.session.frontdoor import FairQueue
from calque.session.isolation import acl_bytes, acl_users
from calque.session.service import Caller


def test_fair_queue_serves_uids_round_robin() -> None:
    q = FairQueue()
    for i in range(5):
        q.put(1000, (None, f"mallory-{i}".encode()))  # type: ignore[arg-type]
    q.put(1001, (None, b"alice"))  # type: ignore[arg-type]
    q.put(1002, (None, b"carol"))  # type: ignore[arg-type]
    order = []
    for _ in range(7):
        item = q.get()
        assert item is not None
        order.append(item[1].decode())
    assert order == ["mallory-0", "alice", "carol", "mallory-1", "mallory-2", "mallory-3", "mallory-4"]


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
    d = Daemon(cfg)
    reader = _FailsOnce(d.service.reader)
    d.service.reader = reader  # type: ignore[assignment]
    s = d.service.handle(Caller(pid=os.getpid(), uid=0, gid=0, user="root", admin=True), "checkout", {"ttl": "1s"})
    d.enforcer.start()
    try:
        deadline = time.monotonic() + 10
        while d.service.registry.live() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert d.service.registry.live() == [], "the session outlived a failed reclaim"
        assert reader.calls >= 2  # the first attempt failed; a retry ended it
        ended = d.service.registry.get(s["id"])
        assert ended is not None and ended.session.end_reason == "expired"
    finally:
        d.enforcer.stop()
        d.registry.close()
        d.audit.close()
