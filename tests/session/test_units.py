"""Pieces of the session service that need no daemon: durations, the registry's guarantees, the
wire format, the usage report, the installed files and the CLI's help."""

from __future__ import annotations

import shutil
import socket
import sqlite3
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import click
import pytest
import yaml
from calque.cli.main import cli, run
from calque.errors import InfrastructureError, UsageError
from calque.models.session import Slice
from calque.session.daemon.registry import Registry
from calque.session.daemon.rows import NoFreeSlice, TooManySessions
from calque.session.daemon.schema import USAGE_TABLE
from calque.session.daemon.usage import usage_report
from calque.session.daemon.wire import RequestError, parse_request, read_line
from calque.session.fleet.assets import broker_unit, example_config, systemd_unit
from calque.session.session_config import SessionConfig


def _slices(n: int) -> list[Slice]:
    return [
        Slice(id=f"MIG-{i}", kind="mig", gpu_index=0, gpu_uuid="GPU-0", profile="1g.5gb", mig_uuid=f"MIG-{i}")
        for i in range(n)
    ]


def test_registry_refuses_a_second_live_session_on_a_slice_even_in_raw_sql(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "s.db")
    kw = {
        "gid": 0,
        "user": "u",
        "now": 0.0,
        "ttl": 60.0,
        "max_sessions": None,
        "request_id": None,
        "env_for": lambda s: {},
    }
    held, created = reg.checkout(_slices(1), session_id="s-1", uid=1000, **kw)  # type: ignore[arg-type]
    assert created and held.session.slice_id == "MIG-0"
    with pytest.raises(NoFreeSlice) as exc:
        reg.checkout(_slices(1), session_id="s-2", uid=1001, **kw)  # type: ignore[arg-type]
    assert [h.session.id for h in exc.value.busy] == ["s-1"]
    db = sqlite3.connect(tmp_path / "s.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with pytest.raises(sqlite3.IntegrityError):
        db.execute(
            "INSERT INTO sessions(id, slice_id, uid, gid, user, created_at, expires_at, last_active, slice_json,"
            " env_json) VALUES ('s-x', 'MIG-0', 2, 2, 'x', 0, 1, 0, '{}', '{}')"
        )
    db.rollback()
    db.close()
    assert reg.end("s-1", "checkin", 1.0, owner=1001) is None  # not the holder's: nothing ends
    assert reg.get("s-1").session.ended_at is None  # type: ignore[union-attr]
    ended = reg.end("s-1", "checkin", 1.0, owner=1000)
    assert ended is not None and ended.session.end_reason == "checkin" and ended.slice.id == "MIG-0"
    assert reg.end("s-1", "checkin", 2.0) is None  # ended once
    held2, _ = reg.checkout(_slices(1), session_id="s-3", uid=1001, **kw)  # type: ignore[arg-type]
    assert held2.session.uid == 1001


def test_registry_limits_sessions_and_replays_a_request_id(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "s.db")
    kw = {"gid": 0, "user": "u", "now": 0.0, "ttl": 60.0, "env_for": lambda s: {}}
    a, created = reg.checkout(_slices(3), session_id="s-a", uid=7, max_sessions=1, request_id="r1", **kw)  # type: ignore[arg-type]
    again, created2 = reg.checkout(_slices(3), session_id="s-b", uid=7, max_sessions=1, request_id="r1", **kw)  # type: ignore[arg-type]
    assert created and not created2 and again.session.id == a.session.id
    with pytest.raises(TooManySessions):
        reg.checkout(_slices(3), session_id="s-c", uid=7, max_sessions=1, request_id="r2", **kw)  # type: ignore[arg-type]


def test_read_line_limits_size_and_time() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b'{"version": 1, "op": "ping"}\nextra')
        assert parse_request(read_line(a, 1024, 1.0)).op == "ping"
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"x" * 2000)
        with pytest.raises(RequestError, match="larger than 1024"):
            read_line(a, 1024, 1.0)
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b'{"version"')
        with pytest.raises(RequestError, match="within"):
            read_line(a, 1024, 0.2)


def test_usage_report_sums_hours_per_user_and_profile_from_the_registry(tmp_path: Path) -> None:
    t0 = datetime(2026, 11, 1, tzinfo=timezone.utc).timestamp()
    reg = Registry(tmp_path / "s.db")
    slices = _slices(3)

    def take(sid: str, at_h: float, uid: int, sl: Slice) -> None:
        reg.checkout([sl], session_id=sid, uid=uid, gid=uid, user=f"u{uid}", now=t0 + at_h * 3600, ttl=86400.0,
                     max_sessions=None, request_id=None, env_for=lambda s: {})  # fmt: skip

    take("a", 0, 1000, slices[0])
    reg.end("a", "checkin", t0 + 2 * 3600)
    take("b", 1, 1001, slices[1])
    reg.end("b", "expired", t0 + 1.5 * 3600)
    take("c", 3, 1000, slices[2])  # still live at the end of the window
    take("d", 5, 1000, slices[0])  # after the window
    since, until = datetime.fromtimestamp(t0, timezone.utc), datetime.fromtimestamp(t0 + 4 * 3600, timezone.utc)
    rep = usage_report(reg, since, until, None)
    rows = {(r.user, r.profile): (r.sessions, r.gpu_hours) for r in rep.rows}
    assert rows == {("u1000", "1g.5gb"): (2, 3.0), ("u1001", "1g.5gb"): (1, 0.5)}
    mine = usage_report(reg, since, until, 1001)
    assert [(r.user, r.gpu_hours) for r in mine.rows] == [("u1001", 0.5)]
    reg.close()


# The registry as calque wrote it before usage rows were clustered (schema 2) and before the usage
# table existed (schema 1: ended sessions only in the sessions table).
_SCHEMA_1 = """
CREATE TABLE sessions(id TEXT PRIMARY KEY, slice_id TEXT NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
  user TEXT NOT NULL, request_id TEXT, created_at REAL NOT NULL, expires_at REAL NOT NULL,
  notice_sent INTEGER NOT NULL DEFAULT 0, ended_at REAL, end_reason TEXT, last_active REAL NOT NULL,
  slice_json TEXT NOT NULL, env_json TEXT NOT NULL, daemon TEXT);
"""
_SCHEMA_2_USAGE = """
CREATE TABLE usage(session_id TEXT PRIMARY KEY, uid INTEGER NOT NULL, user TEXT NOT NULL, kind TEXT NOT NULL,
  profile TEXT NOT NULL, gpu INTEGER NOT NULL, slice_id TEXT NOT NULL, started_at REAL NOT NULL,
  ended_at REAL NOT NULL, end_reason TEXT NOT NULL);
CREATE INDEX usage_by_uid ON usage(uid, ended_at);
CREATE INDEX usage_by_end ON usage(ended_at);
"""


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_an_older_registry_is_migrated_with_every_usage_row_and_a_newer_one_refused(
    tmp_path: Path, version: int
) -> None:
    t0 = datetime(2026, 11, 1, tzinfo=timezone.utc).timestamp()
    sl = _slices(1)[0]
    db = sqlite3.connect(tmp_path / "s.db")
    v3 = f"CREATE TABLE {USAGE_TABLE.format(name='usage')};"
    usage = {2: _SCHEMA_2_USAGE, 3: v3, 4: v3}.get(version, "")
    db.executescript(_SCHEMA_1 + usage)
    db.execute(
        "INSERT INTO sessions VALUES ('old', ?, 1000, 1000, 'u1000', NULL, ?, ?, 0, ?, 'checkin', ?, ?, '{}', NULL)",
        (sl.id, t0, t0 + 7200, t0 + 3600, t0, sl.model_dump_json()),
    )
    # A live session whose slice was last seen active at t0 + 100: its idle clock survives the migration.
    live = _slices(2)[1]
    db.execute(
        "INSERT INTO sessions VALUES ('live', ?, 1001, 1001, 'u1001', NULL, ?, ?, 0, NULL, NULL, ?, ?, '{}', NULL)",
        (live.id, t0, t0 + 7200, t0 + 100, live.model_dump_json()),
    )
    if version >= 2:
        db.execute(
            "INSERT INTO usage VALUES ('old', 1000, 'u1000', 'mig', '1g.5gb', 0, ?, ?, ?, 'checkin')",
            (sl.id, t0, t0 + 3600),
        )
    if version == 4:  # schema 4's idle notice column, after the rows that predate it
        db.execute("ALTER TABLE sessions ADD COLUMN idle_notice_sent INTEGER NOT NULL DEFAULT 0")
    db.execute(f"PRAGMA user_version={version}")
    db.commit()
    db.close()
    reg = Registry(tmp_path / "s.db")
    since, until = datetime.fromtimestamp(t0, timezone.utc), datetime.fromtimestamp(t0 + 4 * 3600, timezone.utc)
    assert [(r.user, r.sessions, r.gpu_hours) for r in usage_report(reg, since, until, 1000).rows] == [
        ("u1000", 1, 1.0)
    ]
    reg.end("new", "checkin", t0)  # not live: nothing written, nothing fails
    kept = reg.get("live")
    assert kept is not None and kept.last_active == t0 + 100 and not kept.idle_notice
    reg.mark_idle_notice("live")
    assert reg.get("live").idle_notice  # type: ignore[union-attr]
    reg.close()
    db = sqlite3.connect(tmp_path / "s.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == 5
    assert db.execute("SELECT COUNT(*) FROM demand").fetchone()[0] == 0  # schema 5: demand records, empty
    assert db.execute("SELECT COUNT(*) FROM drains").fetchone()[0] == 0  # schema 5: drains, none yet
    ddl = db.execute("SELECT sql FROM sqlite_master WHERE name='usage'").fetchone()[0]
    assert "WITHOUT ROWID" in ddl and "PRIMARY KEY(uid, ended_at, session_id)" in ddl
    assert db.execute("SELECT name FROM sqlite_master WHERE name LIKE 'usage_by%'").fetchall() == []
    db.execute("PRAGMA user_version=6")
    db.commit()
    db.close()
    with pytest.raises(InfrastructureError, match="schema 6 registry, newer than this calque's 5"):
        Registry(tmp_path / "s.db")


def test_example_config_is_valid_and_unknown_keys_are_rejected() -> None:
    data = yaml.safe_load(example_config().read_text())
    assert SessionConfig.model_validate(data).socket == Path("/run/calque/session.sock")
    with pytest.raises(ValueError, match="extra"):
        SessionConfig.model_validate({**data, "sockett": "/tmp/x"})
    with pytest.raises(ValueError, match="signal name"):
        SessionConfig.model_validate({**data, "notice_signal": "USR1"})


def test_systemd_unit_runs_the_daemon_and_verifies(tmp_path: Path) -> None:
    text = systemd_unit().read_text()
    assert "ExecStart=" in text and "session serve --config /etc/calque/session.yaml" in text
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed")
    unit = tmp_path / "calque-session.service"
    unit.write_text(text.replace("/opt/calque/venv/bin/calque", "/bin/true"))
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    problems = [line for line in res.stderr.splitlines() if "calque-session.service" in line]
    assert not problems, problems


def test_broker_unit_runs_the_broker_and_verifies(tmp_path: Path) -> None:
    text = broker_unit().read_text()
    assert "session broker --config /etc/calque/broker.yaml" in text
    assert "CapabilityBoundingSet=CAP_SETUID CAP_SETGID\n" in text  # the local path, nothing more
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed")
    unit = tmp_path / "calque-broker.service"
    unit.write_text(text.replace("/opt/calque/venv/bin/calque", "/bin/true"))
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    problems = [line for line in res.stderr.splitlines() if "calque-broker.service" in line]
    assert not problems, problems


def test_every_session_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    group = cli.get_command(click.Context(cli), "session")
    assert isinstance(group, click.Group)
    assert group.help
    names = set(group.commands)
    assert names >= {"checkout", "checkin", "extend", "status", "list", "release", "report", "serve", "queue", "broker"}
    for name in sorted(names):
        assert group.commands[name].help, name
        assert run(["session", name, "--help"]) == 0
    out = capsys.readouterr().out
    assert "--i-understand-shared-gpu-has-no-isolation" in out and "--shell" in out


def test_mps_checkout_without_consent_is_refused_before_any_daemon(tmp_path: Path) -> None:
    assert run(["session", "checkout", "--mps", "--socket", str(tmp_path / "none.sock")]) == 4


def test_no_daemon_is_exit_6_with_a_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["session", "status", "--socket", str(tmp_path / "none.sock")]) == 6
    assert "calque-session.service" in capsys.readouterr().err


def test_mps_slots_on_a_mig_gpu_are_refused(tmp_path: Path) -> None:
    from calque.gpu.sim import SimGpu
    from calque.session.slices import inventory

    sim = SimGpu.create(tmp_path / "gpus.json", ["A100-40GB", "L4-24GB"], mig=True, root=tmp_path / "root")
    sim.create_instances(0, ["3g.20gb"])
    ok_cfg = SessionConfig(mps=[{"gpu": 1, "slots": 2, "active_thread_percentage": 50, "pinned_mem_limit_mib": 1024}])  # type: ignore[list-item]
    kinds = [(s.kind, s.gpu_index) for s in inventory(ok_cfg, sim)]
    assert kinds == [("mig", 0), ("mps", 1), ("mps", 1)]
    bad = SessionConfig(mps=[{"gpu": 0, "slots": 2, "active_thread_percentage": 50, "pinned_mem_limit_mib": 1024}])  # type: ignore[list-item]
    with pytest.raises(UsageError, match="MIG mode"):
        inventory(bad, sim)
