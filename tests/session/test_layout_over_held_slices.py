"""A MIG layout change over a checked-out slice: the layout operation asks the real session daemon.

Check mode warns that the real run will be refused (naming the GPU, the instance, the holder, the
session's end and calque_gpu_layout_force); the real run refuses with every device as it was; a
layout that can keep the held slice keeps it; with force the session is ended first (reason layout:
audited, its usage recorded) and no live session is ever left on a device that no longer exists.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

import pytest
import yaml
from calque.errors import RefusedError
from calque.ops.mig import MigLayoutOp, MigRequest

from .conftest import Host, User


def _request(host: Host, mig_devices: dict[str, int], force: bool = False, config: str | None = None) -> MigRequest:
    return MigRequest(
        layout=[{"devices": [0], "mig-enabled": True, "mig-devices": mig_devices}],
        force=force,
        gpu_backend="sim",
        sim_state=str(host.sim.state_path),
        session_socket=str(host.socket),
        session_config=config or str(host.dir / "no-session.yaml"),  # never this machine's /etc/calque
    )


def _whole_layout_args(host: Host) -> list[str]:
    """``calque gpu mig plan`` of one 7g.40gb on GPU 0 (a file), against this host's GPUs and daemon."""
    layout_file = host.dir / "whole.yaml"
    layout = {
        "version": 1,
        "mig-configs": {"whole": [{"devices": [0], "mig-enabled": True, "mig-devices": {"7g.40gb": 1}}]},
    }
    layout_file.write_text(yaml.safe_dump(layout))
    args = ["gpu", "mig", "plan", "--config", str(layout_file), "--gpu-backend", "sim"]
    return [*args, "--sim-state", str(host.sim.state_path), "--session-socket", str(host.socket)]


def _live_on_missing_devices(host: Host) -> list[tuple[str, str]]:
    """Sessions the registry holds live whose MIG device is gone from the GPU (read by the test only:
    the daemon's own list shows present slices, so it cannot show this)."""
    devices = {d.uuid for d in host.sim.mig_devices()}
    db = sqlite3.connect(host.dir / "state/sessions.db")
    try:
        rows = db.execute("SELECT id, json_extract(slice_json, '$.mig_uuid') FROM sessions WHERE ended_at IS NULL")
        return [(sid, uuid) for sid, uuid in rows if uuid not in devices]
    finally:
        db.close()


def test_a_layout_over_a_held_slice_warns_refuses_keeps_it_or_ends_it_first(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice = make_user()
    host.start()
    held = json.loads(host.cli(alice, "session", "checkout", "--ttl", "2h", "--json", check=True).stdout)
    before = sorted(d.uuid for d in host.sim.mig_devices())
    assert held["slice_id"].removeprefix("MIG-") in {u.removeprefix("MIG-") for u in before}

    # check mode: no change, and the warning a person acts on
    whole = _request(host, {"7g.40gb": 1})
    checked = MigLayoutOp().run(whole, check_mode=True)
    assert not checked.changed and checked.actions == []
    refused = next(w for w in checked.warnings if w.startswith("the real run will be refused"))
    assert "GPU 0" in refused and "1g.5gb@" in refused and alice.name in refused
    assert held["id"] in refused and held["expires_at"][:10] in refused and "calque_gpu_layout_force" in refused
    forced_plan = next(w for w in checked.warnings if w.startswith("with force it would"))
    assert f"end session {held['id']} of {alice.name} (reason layout)" in forced_plan
    assert checked.result.refusal == refused.removeprefix("the real run will be refused: ")

    # the real run refuses before any change
    with pytest.raises(RefusedError, match=alice.name) as exc:
        MigLayoutOp().run(whole)
    assert "calque_gpu_layout_force" in str(exc.value)
    assert sorted(d.uuid for d in host.sim.mig_devices()) == before
    assert [s["id"] for s in json.loads(host.cli(alice, "session", "status", "--json", check=True).stdout)] == [
        held["id"]
    ]

    # a layout that can keep her slice keeps it, without force
    fewer = MigLayoutOp().run(_request(host, {"1g.5gb": 3}))
    assert fewer.changed and fewer.result.ended_sessions == []
    kept = {d.uuid for d in host.sim.mig_devices()}
    assert len(kept) == 3 and any(u.endswith(held["slice_id"].removeprefix("MIG-")) for u in kept)
    assert [s["id"] for s in json.loads(host.cli(alice, "session", "status", "--json", check=True).stdout)] == [
        held["id"]
    ]

    # `calque gpu mig plan --force` says, in words, which session it ends first
    args = _whole_layout_args(host)
    shown = host.cli(None, *args, "--force", check=True)
    assert f"end session {held['id']} of {alice.name} (reason layout)" in shown.stdout
    as_json = json.loads(host.cli(None, *args, "--force", "--json", check=True).stdout)
    assert [s["session_id"] for b in as_json["result"]["stopped_processes"] for s in b["sessions"]] == [held["id"]]

    # force: the session ends first (reason layout), then the device goes
    forced = MigLayoutOp().run(_request(host, {"7g.40gb": 1}, force=True))
    assert forced.changed and [s.session_id for s in forced.result.ended_sessions] == [held["id"]]
    assert forced.actions[0] == f"ended session {held['id']} of {alice.name} (reason layout)"
    assert [d.profile for d in host.sim.mig_devices()] == ["7g.40gb"]
    assert json.loads(host.cli(alice, "session", "status", "--json", check=True).stdout) == []
    assert _live_on_missing_devices(host) == []
    ends = [e for e in host.audit_events() if e.get("session") == held["id"] and e["event"] == "release"]
    assert [e["reason"] for e in ends] == ["released: layout"]
    db = sqlite3.connect(host.dir / "state/sessions.db")
    try:
        usage = db.execute("SELECT end_reason FROM usage WHERE session_id = ?", (held["id"],)).fetchall()
    finally:
        db.close()
    assert usage == [("layout",)]
    report = json.loads(host.cli(None, "session", "report", "--json", check=True).stdout)
    assert any(r["user"] == alice.name and r["sessions"] == 1 for r in report["rows"])


def test_no_session_service_is_said_and_treated_as_no_sessions(host: Host) -> None:
    """Where no session service is set up (no config, no socket), the plan says so and protects no session."""
    planned = MigLayoutOp().run(_request(host, {"7g.40gb": 1}), check_mode=True)
    assert planned.changed and planned.result.refusal is None
    assert any("no session service on this host" in w and "no session to protect" in w for w in planned.warnings)
    assert MigLayoutOp().run(_request(host, {"7g.40gb": 1})).changed


def test_a_layout_change_with_the_session_daemon_down_is_refused_without_force(
    host: Host, make_user: Callable[..., User]
) -> None:
    """A configured daemon that is stopped (no socket) or dead (a socket nothing answers) cannot say who
    holds what: a change that destroys instances is refused, naming the daemon and how to start it; her
    session survives to the daemon's restart. A plan made while it answered is refused at the apply if it
    stopped since. With force the change runs."""
    alice = make_user()
    host.start()
    held = json.loads(host.cli(alice, "session", "checkout", "--ttl", "2h", "--json", check=True).stdout)
    before = sorted(d.uuid for d in host.sim.mig_devices())
    config = str(host.dir / "session.yaml")  # the daemon's own config (host.start wrote it)
    host.stop()  # systemctl stop: the daemon removes its socket
    assert not host.socket.exists()

    checked = MigLayoutOp().run(_request(host, {"7g.40gb": 1}, config=config), check_mode=True)
    assert not checked.changed and checked.result.refusal is not None
    assert [w for w in checked.warnings if "calque-session.service" in w] == [  # said once
        "the real run will be refused: " + checked.result.refusal
    ]
    for words in ("calque-session.service", "systemctl start calque-session.service", config, "--force"):
        assert words in checked.result.refusal
    with pytest.raises(RefusedError, match=r"systemctl start calque-session\.service"):
        MigLayoutOp().run(_request(host, {"7g.40gb": 1}, config=config))
    assert sorted(d.uuid for d in host.sim.mig_devices()) == before

    host.start()
    host.kill9()  # a crash: the socket file stays, nothing answers (no config needed to know a daemon was here)
    assert host.socket.exists()
    with pytest.raises(RefusedError, match=r"its socket left behind.*does not answer"):
        MigLayoutOp().run(_request(host, {"7g.40gb": 1}))
    assert sorted(d.uuid for d in host.sim.mig_devices()) == before

    host.start()
    assert [s["id"] for s in json.loads(host.cli(alice, "session", "status", "--json", check=True).stdout)] == [
        held["id"]
    ]
    # planned while the daemon answered (nothing held), applied after it stopped: the apply asks again, and refuses
    host.cli(alice, "session", "checkin", held["id"], check=True)
    op = MigLayoutOp()
    planned = op.plan(_request(host, {"7g.40gb": 1}, config=config))
    assert planned.refusal is None and planned.doomed
    host.stop()
    with pytest.raises(RefusedError, match=r"systemctl start calque-session\.service"):
        op.apply(planned)
    assert sorted(d.uuid for d in host.sim.mig_devices()) == before

    forced = MigLayoutOp().run(_request(host, {"7g.40gb": 1}, force=True, config=config))
    assert forced.changed and [d.profile for d in host.sim.mig_devices()] == ["7g.40gb"]


def test_a_plan_the_real_run_refuses_shows_the_layout_asked_for_and_exits_4(
    host: Host, make_user: Callable[..., User]
) -> None:
    """`calque gpu mig plan` over a held slice: the layout asked for, the refusal, exit 4 (as apply would);
    `--json` the same outcome with the refusal as its failure; never "nothing to do ... no change needed"."""
    alice = make_user()
    host.start()
    held = json.loads(host.cli(alice, "session", "checkout", "--ttl", "2h", "--json", check=True).stdout)
    args = _whole_layout_args(host)

    shown = host.cli(None, *args)
    assert shown.returncode == 4, shown.stdout + shown.stderr
    assert "gpu0: " + " ".join(f"1g.5gb@{i}" for i in range(7)) + "  ->  7g.40gb@0  (asked for)" in shown.stdout
    assert "nothing to do" not in shown.stdout and "no change needed" not in shown.stdout
    assert "refused" in shown.stdout.splitlines()[-1]
    error = shown.stderr.strip().splitlines()[-1]
    assert error.startswith("calque: error: the real run will be refused:") and held["id"] in error
    assert alice.name in error

    as_json = host.cli(None, *args, "--json")
    assert as_json.returncode == 4, as_json.stderr
    outcome = json.loads(as_json.stdout)
    assert outcome["failure"] == {"message": error.removeprefix("calque: error: "), "exit_code": 4}
    assert outcome["result"]["requested"]["gpu0"] == {"mig_enabled": True, "instances": ["7g.40gb@0"]}
    assert outcome["changed"] is False and outcome["after"] == outcome["before"]
    assert json.loads(as_json.stderr.strip().splitlines()[-1])["error"]["exit_code"] == 4

    # a plan the real run takes exits 0 and shows the same layout as its after
    host.cli(alice, "session", "checkin", held["id"], check=True)
    taken = json.loads(host.cli(None, *args, "--json", check=True).stdout)
    assert taken["failure"] is None and taken["after"]["gpu0"] == outcome["result"]["requested"]["gpu0"]
