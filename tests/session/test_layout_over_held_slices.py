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


def _request(host: Host, mig_devices: dict[str, int], force: bool = False) -> MigRequest:
    return MigRequest(
        layout=[{"devices": [0], "mig-enabled": True, "mig-devices": mig_devices}],
        force=force,
        gpu_backend="sim",
        sim_state=str(host.sim.state_path),
        session_socket=str(host.socket),
    )


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
    layout_file = host.dir / "whole.yaml"
    layout = {
        "version": 1,
        "mig-configs": {"whole": [{"devices": [0], "mig-enabled": True, "mig-devices": {"7g.40gb": 1}}]},
    }
    layout_file.write_text(yaml.safe_dump(layout))
    args = ["gpu", "mig", "plan", "--config", str(layout_file), "--gpu-backend", "sim"]
    args += ["--sim-state", str(host.sim.state_path), "--session-socket", str(host.socket)]
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
    """Where no daemon answers (none configured, or stopped), the plan says so and protects no session."""
    planned = MigLayoutOp().run(_request(host, {"7g.40gb": 1}), check_mode=True)
    assert planned.changed
    assert any("no session service at" in w and "no session to protect" in w for w in planned.warnings)
