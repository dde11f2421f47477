"""The broker's queue on a real SQLite file: its order (FIFO in a lab, fair share between labs,
aging), its bounds, and what survives a restart."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from calque.errors import InfrastructureError, RefusedError
from calque.models.institution import Institution, Lab
from calque.session.broker.fairness import Span, Waiting, chosen_lab, lab_of, lab_usage, order
from calque.session.broker.store import NewRequest, Row, Store, TooManyQueued
from support.waits import HANG_S

HOUR = 3600.0


def _req(rid: str, uid: int, lab: str, now: float, *, wait: bool = True, profile: str | None = "1g.24gb") -> NewRequest:
    return NewRequest(rid, uid, f"u{uid}", lab, "mig", profile, HOUR, False, wait, now, None)


def _w(rid: str, seq: int, lab: str, at: float, ttl: float | None = HOUR) -> Waiting:
    return Waiting(rid, seq, seq, f"u{seq}", lab, "mig", None, ttl, at)


def test_fifo_inside_a_lab_and_the_lab_below_its_share_first() -> None:
    # Lab a used 10 h over the window, lab b nothing; equal shares: b's requests come first, then
    # the labs interleave as each pick charges its lab an hour. Inside a lab: arrival order.
    q = [_w("a1", 1, "a", 0), _w("a2", 2, "a", 1), _w("b1", 3, "b", 2), _w("b2", 4, "b", 3), _w("a3", 5, "a", 4)]
    got = [w.id for w in order(q, {"a": 10 * HOUR}, {"a": 1, "b": 1}, now=10, aging=HOUR, assumed_ttl=HOUR)]
    assert got == ["b1", "b2", "a1", "a2", "a3"]
    # Lab a's 2 h over a share of 4 are 0.5 h a share unit, b's 0 h over 1: b1 first; then b's 1 h
    # against a's 0.5 h and 0.75 h: a1, a2; then 1 h each (a tie: the earlier arrival, b2), then a3.
    got = [w.id for w in order(q, {"a": 2 * HOUR}, {"a": 4, "b": 1}, now=10, aging=HOUR, assumed_ttl=HOUR)]
    assert got == ["b1", "a1", "a2", "b2", "a3"]


def test_aging_puts_a_request_past_the_bound_ahead_of_every_later_one() -> None:
    q = [_w("a1", 1, "a", 0), _w("b1", 2, "b", 50), _w("a2", 3, "a", 60)]
    usage = {"a": 100 * HOUR}
    # Before the bound: b1 first (a is far over its share).
    assert order(q, usage, {"a": 1, "b": 1}, now=99, aging=100, assumed_ttl=HOUR)[0].id == "b1"
    # a1 has waited 100 s: past the bound, it goes ahead of b1 (which came later), whatever a's usage.
    got = [w.id for w in order(q, usage, {"a": 1, "b": 1}, now=100, aging=100, assumed_ttl=HOUR)]
    assert got == ["a1", "b1", "a2"]


def test_a_user_is_in_the_first_lab_of_their_groups() -> None:
    labs = {"vision": frozenset({"vision-lab"}), "nlp": frozenset({"nlp", "nlp-staff"})}
    assert lab_of(frozenset({"users", "nlp-staff"}), labs) == "nlp"
    # In institution.yaml's order (the hosts' ledgers and budgets read Institution.lab_of, the same
    # rule): vision, listed first. By name it was nlp, queued under one lab and billed to the other.
    assert lab_of(frozenset({"nlp", "vision-lab"}), labs) == "vision"
    inst = Institution(labs=[Lab(name=n, groups=sorted(g)) for n, g in labs.items()])
    found = inst.lab_of({"nlp", "vision-lab"})
    assert found is not None and found.name == "vision"
    assert lab_of(frozenset({"users"}), labs) == "default"


def test_lab_is_checked_against_the_users_groups() -> None:
    labs = {"vision": frozenset({"vision-lab"}), "nlp": frozenset({"nlp"})}
    both = frozenset({"nlp", "vision-lab"})
    assert chosen_lab(both, labs, None) == "vision"
    assert chosen_lab(both, labs, "nlp") == "nlp"
    with pytest.raises(ValueError, match="none of lab nlp's groups; your labs: vision"):
        chosen_lab(frozenset({"vision-lab"}), labs, "nlp")
    with pytest.raises(ValueError, match="no lab robotics"):
        chosen_lab(both, labs, "robotics")


def test_fair_share_counts_every_hosts_sessions_and_broker_grants_only_where_no_record_holds_them() -> None:
    # hostA answered at t=100: its record holds a degraded-mode session of lab a (0-100) and a broker
    # grant of lab b (50-100, still live); the broker's grant there counts only after t=100.
    # hostB never answered: its broker grants count whole.
    recorded = {"hostA": (100.0, [Span("a", "hostA", 0, 100), Span("b", "hostA", 50, 100)])}
    grants = [Span("b", "hostA", 50, 130), Span("a", "hostB", 10, 40)]
    assert lab_usage(grants, recorded) == {"a": 100.0 + 30.0, "b": 50.0 + 30.0}
    assert lab_usage(grants, {}) == {"b": 80.0, "a": 30.0}  # no host answered: the grants alone


def test_the_store_keeps_ids_per_user_and_caps_queued_requests(tmp_path: Path) -> None:
    s = Store(tmp_path / "state/broker.db")
    first = s.submit(_req("req-00001", 1001, "a", 0), max_queued=2)
    assert first.state == "queued" and first.seq == 1
    assert s.submit(_req("req-00001", 1001, "a", 5), max_queued=2).enqueued_at == 0  # a retry: the same row
    with pytest.raises(RefusedError, match="another user's"):
        s.submit(_req("req-00001", 1002, "b", 6), max_queued=2)
    s.submit(_req("req-00002", 1001, "a", 1), max_queued=2)
    with pytest.raises(TooManyQueued, match="limit is 2"):
        s.submit(_req("req-00003", 1001, "a", 2), max_queued=2)
    s.submit(_req("req-00003", 1001, "a", 2, wait=False), max_queued=2)  # a direct try is not queued
    # A user cancels only their own request; an admin (uid None) any.
    assert s.cancel("req-00001", 1002) is None
    assert s.get("req-00001").state == "queued"  # type: ignore[union-attr]
    assert s.cancel("req-00001", 1001).state == "cancelled"  # type: ignore[union-attr]
    assert s.cancel("req-00002", None).state == "cancelled"  # type: ignore[union-attr]
    s.close()


def test_a_grant_is_two_commits_and_a_requeue_keeps_its_place(tmp_path: Path) -> None:
    s = Store(tmp_path / "broker.db")
    for i in range(3):
        s.submit(_req(f"req-0000{i}", 1000 + i, "a", i), max_queued=4)
    row = s.begin_grant("req-00000", "hostA")
    assert row is not None and row.state == "granting" and row.host == "hostA"
    assert s.begin_grant("req-00000", "hostB") is None  # bound to hostA until that host answers
    s.requeue("req-00000", "busy")
    assert [r.id for r in s.in_state("queued")] == ["req-00000", "req-00001", "req-00002"]
    s.begin_grant("req-00001", "hostB")
    session = {"id": "s-abc", "slice_id": "MIG-1"}
    held = s.granted("req-00001", session, now=100.0, held_until=160.0, ends_at=100.0 + HOUR)
    assert held is not None and held.state == "held" and held.session == session
    assert s.last_host(1001) == "hostB"
    assert s.grants(0, 100.0 + HOUR / 2) == [Span("a", "hostB", 100.0, 100.0 + HOUR / 2)]
    s.session_ended("hostB", "s-abc", 100.0 + 60)
    assert s.grants(0, 100.0 + HOUR) == [Span("a", "hostB", 100.0, 160.0)]
    s.finish("req-00001", "claimed", only=("held",))
    # Past the window: the ended grant is forgotten, the waiting requests never are.
    assert s.prune(before=100.0 + 61) == 1
    assert s.get("req-00001") is None and [r.id for r in s.live()] == ["req-00000", "req-00002"]
    s.close()


def test_a_second_broker_on_the_same_file_is_refused_and_the_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "state/broker.db"
    s = Store(path)
    with pytest.raises(InfrastructureError, match="another broker"):
        Store(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    s.close()


def test_kill_9_mid_grant_loses_nothing(tmp_path: Path) -> None:
    """A process queues 20 requests, binds one to a host (the commit before the host's checkout) and
    is killed: the next store finds all 20, the bound one still bound to its host and nowhere else."""
    path = tmp_path / "state/broker.db"
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from calque.session.broker.store import NewRequest, Store
        s = Store(Path({str(path)!r}))
        for i in range(20):
            r = NewRequest(f"req-{{i:05d}}", 2000 + i, f"u{{i}}", "a", "mig", None, None, False, True, i, None)
            s.submit(r, max_queued=4)
        s.begin_grant("req-00007", "hostA")
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_S)
    assert res.returncode == -9, res.stderr
    s = Store(path)  # the dead process's lock went with it
    live = s.live()
    assert len(live) == 20 and len({r.seq for r in live}) == 20
    assert [(r.id, r.host) for r in s.in_state("granting")] == [("req-00007", "hostA")]
    assert s.begin_grant("req-00007", "hostB") is None
    s.close()


class _SubmitAfterEachRead(Store):
    """A store where another user's request lands right after every read, as a ``checkout --wait``
    arriving while ``calque session queue`` reads the queue would."""

    arrivals = 0

    def _rows(self, where: str, params: tuple[object, ...] = ()) -> list[Row]:
        rows = super()._rows(where, params)
        self.arrivals += 1
        self.submit(_req(f"req-late{self.arrivals:04d}", 2000 + self.arrivals, "b", 50.0), max_queued=4)
        return rows


def test_every_queued_request_the_queue_lists_has_its_position_though_requests_arrive_meanwhile(
    tmp_path: Path,
) -> None:
    from calque.models.broker import QueueArgs
    from calque.session.broker.broker_config import BrokerConfig
    from calque.session.broker.callers import Caller
    from calque.session.broker.dispatch import Dispatcher
    from calque.session.broker.grants import Granter
    from calque.session.broker.hosts import HostCache
    from calque.session.broker.service import BrokerService

    store = _SubmitAfterEachRead(tmp_path / "broker.db")
    for i in range(2):
        Store.submit(store, _req(f"req-0000{i}", 1000 + i, "a", float(i)), max_queued=4)
    cache = HostCache({})
    config = BrokerConfig(db=tmp_path / "broker.db")
    dispatcher = Dispatcher(config, store, cache, Granter(store, cache, claim_window=60.0), {})  # never started
    service = BrokerService(store, cache, dispatcher.granter, dispatcher)
    admin = Caller(uid=0, gid=0, user="root", groups=frozenset(), lab="default", admin=True)
    for _ in range(3):
        listed = service.queue(admin, QueueArgs(all=True))
        queued = [e for e in listed if e["state"] == "queued"]
        assert queued and all(e["position"] is not None for e in queued), listed
        assert sorted(e["position"] for e in queued) == list(range(1, len(queued) + 1))
    assert store.arrivals >= 3  # requests did arrive between and after the readings
    store.close()


SCHEMA_1_REQUESTS = """
CREATE TABLE requests(id TEXT PRIMARY KEY, seq INTEGER NOT NULL, uid INTEGER NOT NULL, user TEXT NOT NULL,
  lab TEXT NOT NULL, kind TEXT NOT NULL, profile TEXT, ttl REAL, consent INTEGER NOT NULL, wait INTEGER NOT NULL,
  enqueued_at REAL NOT NULL, wait_until REAL, state TEXT NOT NULL, host TEXT, session_id TEXT, session_json TEXT,
  granted_at REAL, ends_at REAL, held_until REAL, mailed_before REAL, note TEXT);
INSERT INTO requests(id, seq, uid, user, lab, kind, consent, wait, enqueued_at, state, host)
  VALUES ('req-old-0001', 1, 1001, 'u1001', 'a', 'mig', 0, 1, 5.0, 'granting', 'hostA');
PRAGMA user_version=1;
"""


def test_a_schema_1_queue_keeps_its_requests_and_a_stranded_grant_ends_with_a_stray(tmp_path: Path) -> None:
    """A queue file of the broker before ``granting_for``: opened as it is, its granting row bound to
    its host; expired, it leaves a stray on that host and stops counting against the user's cap."""
    path = tmp_path / "state/broker.db"
    path.parent.mkdir(mode=0o700)
    db = sqlite3.connect(str(path))
    db.executescript(SCHEMA_1_REQUESTS)
    db.close()
    path.chmod(0o600)
    s = Store(path)
    (row,) = s.live()
    assert (row.id, row.state, row.host, row.granting_at, row.gpu) == ("req-old-0001", "granting", "hostA", None, None)
    with pytest.raises(TooManyQueued):
        s.submit(_req("req-new-0001", 1001, "a", 6.0), max_queued=1)
    assert s.expire_grant("req-old-0001", "host hostA did not answer").state == "expired"  # type: ignore[union-attr]
    assert [(r.id, host) for r, host in s.strays()] == [("req-old-0001", "hostA")]
    assert s.submit(_req("req-new-0001", 1001, "a", 6.0), max_queued=1).state == "queued"
    assert s.prune(before=1e12) == 0  # a stray's request is kept until its host answered
    s.settle_stray("req-old-0001")
    assert s.prune(before=1e12) == 1
    s.close()
    db = sqlite3.connect(str(path))
    assert db.execute("PRAGMA user_version").fetchone()[0] == 4  # 4: requests.gpu, added on open
    assert db.execute("SELECT COUNT(*) FROM reservations").fetchone()[0] == 0  # schema 3's table, made on open
    db.close()
