"""Demand records: checkouts refused for want of a free slice, written by the checkout's transaction.

Registry-level rules (one ask one row, its retries counted, a later grant linked, limits not counted)
on a real SQLite file, then the daemon itself: a second Unix user refused (exit 5) and waiting, read
back by ``calque gpu mig suggest``'s reader."""

from __future__ import annotations

import json
import socket
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from calque.models.session import Slice
from calque.session.client.history import read_history
from calque.session.daemon.demand import SAME_ASK_S, Ask
from calque.session.daemon.registry import Registry
from calque.session.daemon.rows import NoFreeSlice, TooManySessions
from support.waits import HANG_S

from .conftest import Host, User, wait_for
from .institution import institution

SLICES = [
    Slice(id=f"MIG-{i}", kind="mig", gpu_index=0, gpu_uuid="GPU-0", profile="1g.5gb", mig_uuid=f"MIG-{i}")
    for i in range(2)
]
ASK = Ask("mig", "1g.5gb")


def _try(reg: Registry, sid: str, uid: int, now: float, request_id: str | None = None, **kw: object) -> bool:
    try:
        reg.checkout(
            SLICES, session_id=sid, uid=uid, gid=uid, user=f"u{uid}", now=now, ttl=3600.0,
            max_sessions=kw.get("max_sessions"), request_id=request_id, env_for=lambda s: {}, ask=ASK,
        )  # type: ignore[arg-type]  # fmt: skip
    except NoFreeSlice:
        return False
    return True


def _rows(path: Path) -> list[tuple[object, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute(
            "SELECT uid, first_at, last_at, attempts, profile, request_id, session_id FROM demand ORDER BY first_at"
        ).fetchall()
    finally:
        db.close()


def test_one_ask_is_one_row_its_retries_count_and_a_later_grant_names_its_session(tmp_path: Path) -> None:
    path = tmp_path / "state" / "sessions.db"
    reg = Registry(path)
    assert _try(reg, "s-a", 1000, 100.0) and _try(reg, "s-b", 1001, 100.0)
    assert not _try(reg, "s-c", 1002, 200.0)  # every 1g.5gb held: refused, recorded
    assert not _try(reg, "s-c", 1002, 205.0)  # a --wait retry: the same ask
    assert not _try(reg, "s-c", 1002, 200.0 + 2 * SAME_ASK_S + 10)  # later than a retry loop: a new ask
    assert not _try(reg, "s-d", 1003, 210.0)  # another user: their own ask
    assert [r[:4] for r in _rows(path)] == [(1002, 200.0, 205.0, 2), (1003, 210.0, 210.0, 1), (1002, 270.0, 270.0, 1)]
    reg.end("s-a", "checkin", 275.0)
    assert _try(reg, "s-c", 1002, 280.0)  # the waiting user's next try gets the freed slice
    rows = _rows(path)
    assert [r[6] for r in rows] == [None, None, "s-c"]  # only the ask it continues names the session
    reg.close()


def test_a_retried_request_id_is_one_ask_however_far_apart_and_limits_are_not_demand(tmp_path: Path) -> None:
    path = tmp_path / "state" / "sessions.db"
    reg = Registry(path)
    assert _try(reg, "s-a", 1000, 0.0) and _try(reg, "s-b", 1001, 0.0)
    assert not _try(reg, "x", 1002, 10.0, request_id="r-1")
    assert not _try(reg, "x", 1002, 900.0, request_id="r-1")  # the broker asking again with its request id
    with pytest.raises(TooManySessions):
        _try(reg, "s-z", 1000, 950.0, max_sessions=1)  # the caller's own limit: no want of slices
    assert [r[:4] + r[5:6] for r in _rows(path)] == [(1002, 10.0, 900.0, 2, "r-1")]
    reg.close()


def test_the_registry_migrates_to_schema_5_and_knows_since_when_it_records(tmp_path: Path) -> None:
    path = tmp_path / "state" / "sessions.db"
    reg = Registry(path)
    reg.close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE demand")
    db.execute("DROP TABLE registry_meta")
    db.execute("PRAGMA user_version=4")
    db.commit()
    db.close()
    before = time.time()
    Registry(path).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 5
    since = float(db.execute("SELECT value FROM registry_meta WHERE key='demand_recorded_since'").fetchone()[0])
    db.close()
    assert before <= since <= time.time()
    Registry(path).close()  # a restart keeps the first time
    h = read_history(path, 0.0, time.time())
    assert h.recorded_since == since and h.refusals == [] and h.uses == []


def test_the_daemon_records_a_second_users_refusal_and_the_grant_its_wait_got(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice, bob = make_user(), make_user()
    host.start()
    held = [host.cli(alice, "session", "checkout", "--ttl", "1h", "--json", check=True) for _ in range(7)]
    refused = host.cli(bob, "session", "checkout", "--profile", "1g.5gb")
    assert refused.returncode == 5, refused.stderr
    # bob waits (his client retries every few seconds) until alice checks one in
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(
            host.cli, bob, "session", "checkout", "--profile", "1g.5gb", "--wait", "--wait-timeout", "40s", "--json"
        )
        db = host.dir / "state/sessions.db"
        assert wait_for(lambda: sum(r.attempts for r in read_history(db, 0.0, time.time() + 1).refusals) >= 3)
        host.cli(alice, "session", "checkin", json.loads(held[0].stdout)["id"], check=True)
        got = waiting.result(timeout=HANG_S)
    assert got.returncode == 0, got.stderr
    rows = read_history(db, 0.0, time.time() + 1).refusals
    # one ask: the refusal, the wait's retries counted in it, and the session the wait got
    assert len(rows) == 1 and rows[0].profile == "1g.5gb" and rows[0].attempts >= 3
    assert rows[0].granted == json.loads(got.stdout)["id"]


def test_a_broker_request_that_waited_in_its_queue_is_recorded_from_when_it_joined(tmp_path: Path) -> None:
    path = tmp_path / "state" / "sessions.db"
    reg = Registry(path)
    assert _try(reg, "s-a", 1000, 1600.0)
    reg.checkout(
        SLICES, session_id="s-b", uid=1001, gid=1001, user="u1001", now=1600.0, ttl=3600.0, max_sessions=None,
        request_id="r-b", env_for=lambda s: {}, ask=Ask("mig", "1g.5gb", None, 1000.0),
    )  # fmt: skip
    # s-b waited 600 s in the broker's queue and was refused nowhere: one row from when it joined
    assert _rows(path) == [(1001, 1000.0, 1600.0, 1, "1g.5gb", "r-b", "s-b")]
    # a request refused here first and then granted from the queue is the one ask it already was
    reg.end("s-a", "checkin", 1700.0)
    reg.end("s-b", "checkin", 1700.0)
    assert _try(reg, "s-d", 1000, 1800.0) and _try(reg, "s-e", 1001, 1800.0)
    assert not _try(reg, "x", 1002, 1810.0, request_id="r-f")
    reg.end("s-d", "checkin", 1900.0)
    reg.checkout(
        SLICES, session_id="s-f", uid=1002, gid=1002, user="u1002", now=1950.0, ttl=3600.0, max_sessions=None,
        request_id="r-f", env_for=lambda s: {}, ask=Ask("mig", "1g.5gb", None, 1805.0),
    )  # fmt: skip
    rows = _rows(path)
    assert rows[1:] == [(1002, 1810.0, 1810.0, 1, "1g.5gb", "r-f", "s-f")]
    reg.close()


def test_the_broker_tells_the_host_how_long_a_request_waited_in_its_queue(make_user: Callable[..., User]) -> None:
    with institution(make_user, {"hostA": 1}) as broker:
        broker.start()
        alice, bob = make_user(), make_user()
        held = broker.anywhere(alice)
        joined = time.time()
        waiter = broker.popen(bob, "session", "checkout", "--anywhere", "--ttl", "1h", "--wait", "--json")
        assert wait_for(lambda: any(e["user"] == bob.name for e in broker.queue_all()))
        time.sleep(1.5)  # waited: longer than a grant takes
        host = broker.hosts["hostA"]
        host.cli(alice, "session", "checkin", held["session"]["id"], check=True)
        out, err = waiter.communicate(timeout=HANG_S)
        assert waiter.returncode == 0, err
        got = json.loads(out)["session"]["id"]
        rows = read_history(host.dir / "state/sessions.db", 0.0, time.time() + 1).refusals
        # the host refused nothing (the broker asks only where a slice is free), yet the wait is there
        assert len(rows) == 1 and rows[0].granted == got and rows[0].profile == ""
        assert joined - 1 <= rows[0].first_at <= joined + 30 and rows[0].last_at - rows[0].first_at >= 1.5


def test_another_user_can_neither_read_the_registry_through_suggest_nor_send_a_bad_queued_since(
    host: Host, make_user: Callable[..., User]
) -> None:
    mallory = make_user()
    host.start()
    db = host.dir / "state/sessions.db"
    res = host.cli(mallory, "gpu", "mig", "suggest", "--registry", str(db), "--sim-state", str(host.sim.state_path))
    assert res.returncode == 4, res.stderr
    assert "permission denied on" in res.stderr and "root" in res.stderr and "Traceback" not in res.stderr
    for bad in ("-1.0", "1e999", '"yesterday"', "NaN", "[]"):  # 1e999 reads as infinity
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(host.socket))
            line = '{"version": 1, "op": "checkout", "args": {"ttl": "10m", "queued_since": ' + bad + "}}\n"
            sock.sendall(line.encode())
            answer = json.loads(sock.makefile().readline())
        assert answer["ok"] is False and "queued_since" in answer["error"]["message"], (bad, answer)
    assert read_history(db, 0.0, time.time() + 1).refusals == []  # nothing recorded from garbage
    # the daemon kept serving
    assert host.cli(mallory, "session", "checkout", "--ttl", "10m", "--json").returncode == 0
