"""A MIG layout change that drains first (``drain``, as ``calque.gpu.gpu_layout`` runs it), over the
real session daemon of a two-A100 host: only the GPU whose layout differs is drained; the session on
a slice it destroys runs out by its own deadline (never ended without force); the session on the
other GPU is never touched; the GPU is undrained after; a second run changes and drains nothing; a
drain someone else made stays; outside the change window nothing changes and check mode says so."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from calque.errors import CalqueError, RefusedError
from calque.gpu.sim import SimGpu
from calque.ops.mig import MigLayoutOp, MigRequest
from support.waits import HANG_S

from .conftest import Host, User, wait_for

pytestmark = pytest.mark.slow


def _two_a100s(host: Host) -> None:
    """The host fixture's GPUs replaced by two A100-40GBs of seven 1g.5gb slices each."""
    root = host.dir / "root2"
    host.sim = SimGpu.create(host.dir / "gpus2.json", ["A100-40GB", "A100-40GB"], mig=True, root=root)
    host.migs = host.sim.create_instances(0, ["1g.5gb"] * 7) + host.sim.create_instances(1, ["1g.5gb"] * 7)
    for p in [root, *root.rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)
    host.config["mps"] = []


def _request(host: Host, gpu0: dict[str, int], **kw: Any) -> MigRequest:
    layout = [
        {"devices": [0], "mig-enabled": True, "mig-devices": gpu0},
        {"devices": [1], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}},  # as it is: unchanged
    ]
    return MigRequest(
        layout=layout,
        gpu_backend="sim",
        sim_state=str(host.sim.state_path),
        session_socket=str(host.socket),
        drain=True,
        **kw,
    )


def _end_reason(host: Host, sid: str) -> str | None:
    with sqlite3.connect(host.dir / "state/sessions.db") as db:
        return db.execute("SELECT end_reason FROM sessions WHERE id=?", (sid,)).fetchone()[0]  # type: ignore[no-any-return]


def _checkout(host: Host, user: User, gpu: int, ttl: str) -> dict[str, Any]:
    res = host.cli(user, "session", "checkout", "--gpu", str(gpu), "--ttl", ttl, "--json")
    assert res.returncode == 0, res.stderr
    s: dict[str, Any] = json.loads(res.stdout)
    return s


def test_a_layout_change_drains_only_the_changed_gpu_waits_for_its_session_and_undrains(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice, bob, carol = make_user(), make_user(), make_user()
    _two_a100s(host)
    host.start()
    other = _checkout(host, bob, 1, "4h")  # on the GPU whose layout stays
    short = _checkout(host, alice, 0, "8s")  # on a slice the new layout destroys
    whole = {"7g.40gb": 1}

    # Check mode, with a wait too short for Alice's session: the real run would be refused (no force).
    late = MigLayoutOp().run(_request(host, whole, drain_wait=1), check_mode=True)
    refusal = next(w for w in late.warnings if w.startswith("the real run will be refused"))
    assert "drain wait of 1 s" in refusal and short["id"] in refusal and alice.name in refusal
    with pytest.raises(RefusedError, match="drain wait") as exc:
        MigLayoutOp().run(_request(host, whole, drain_wait=1))
    assert "calque_gpu_layout_force" in str(exc.value)
    assert host.client().drains() == []  # refused before anything: nothing drained

    # Long enough: check mode predicts the drain of GPU 0 alone, the wait, and the undrain.
    planned = MigLayoutOp().run(_request(host, whole, drain_wait=60), check_mode=True)
    assert planned.changed and planned.result.refusal is None
    assert planned.actions[0] == "GPU 0: drain (no new checkouts while its layout changes)"
    assert "wait up to 0:01:00 for 1 session(s)" in planned.actions[1]
    assert planned.actions[-1] == "GPU 0: undrain" and not any("GPU 1" in a for a in planned.actions)

    done: dict[str, Any] = {}

    def apply() -> None:
        try:
            done["outcome"] = MigLayoutOp().run(_request(host, whole, drain_wait=60))
        except CalqueError as exc:  # pragma: no cover - said by the assertion below
            done["error"] = exc

    t = threading.Thread(target=apply)
    t.start()
    try:
        # While it waits: GPU 0 is drained (by root, for the layout), GPU 1 is not.
        assert wait_for(lambda: [d.gpu for d in host.client().drains()] == [0])
        refused = host.cli(carol, "session", "checkout", "--gpu", "0", "--ttl", "10m")
        assert refused.returncode == 4 and "MIG layout change" in refused.stderr, refused.stderr
        assert _checkout(host, carol, 1, "10m")["gpu_index"] == 1
        assert _end_reason(host, short["id"]) is None  # still Alice's until its own deadline
    finally:
        t.join(HANG_S)
    assert "error" not in done, done.get("error")
    out = done["outcome"]
    assert out.changed and out.result.ended_sessions == []
    assert [d.profile for d in host.sim.mig_devices() if d.gpu_index == 0] == ["7g.40gb"]
    assert _end_reason(host, short["id"]) == "expired"  # ran out; never ended for the layout
    assert time.time() >= datetime.fromisoformat(short["expires_at"]).timestamp()
    assert _end_reason(host, other["id"]) is None  # Bob's, on GPU 1, untouched
    assert host.client().drains() == []  # undrained after
    drains = [(e["event"], e.get("gpu")) for e in host.audit_events() if e["event"] in ("drain", "undrain")]
    assert drains == [("drain", 0), ("undrain", 0)]

    # Twice: nothing to change, nothing drained.
    again = MigLayoutOp().run(_request(host, whole, drain_wait=60))
    assert not again.changed
    assert len([e for e in host.audit_events() if e["event"] == "drain"]) == 1


def test_a_drain_made_by_someone_else_stays_and_force_ends_what_outlives_the_wait(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice = make_user()
    _two_a100s(host)
    host.start()
    long = _checkout(host, alice, 0, "4h")
    # No wait (the role's default): refused as without a drain, naming the variable that forces it.
    with pytest.raises(RefusedError, match="calque_gpu_layout_force") as exc:
        MigLayoutOp().run(_request(host, {"7g.40gb": 1}))
    assert long["id"] in str(exc.value) and host.client().drains() == []
    host.client().drain("fan check", gpu=0)  # root's own drain, before the layout
    forced = MigLayoutOp().run(_request(host, {"7g.40gb": 1}, drain_wait=2, force=True))
    assert [s.session_id for s in forced.result.ended_sessions] == [long["id"]]
    assert _end_reason(host, long["id"]) == "layout"
    assert [(d.gpu, d.reason) for d in host.client().drains()] == [(0, "fan check")]  # still drained


def test_outside_the_change_window_nothing_changes_and_check_mode_says_so(host: Host) -> None:
    _two_a100s(host)
    host.start()
    now = datetime.now(timezone.utc)
    elsewhere = (now + timedelta(days=3)).strftime("%a")  # a day that is not today
    window = [f"{elsewhere} 02:00-03:00"]
    before = sorted(d.uuid for d in host.sim.mig_devices())
    checked = MigLayoutOp().run(_request(host, {"7g.40gb": 1}, window=window), check_mode=True)
    refusal = next(w for w in checked.warnings if w.startswith("the real run will be refused"))
    assert "outside the layout's change window" in refusal and elsewhere in refusal
    assert not any(w.startswith("with force") for w in checked.warnings)
    with pytest.raises(RefusedError, match="change window"):
        MigLayoutOp().run(_request(host, {"7g.40gb": 1}, window=window))
    assert sorted(d.uuid for d in host.sim.mig_devices()) == before and host.client().drains() == []
    # A run that changes nothing is fine outside the window (a second run of the role, say).
    same = MigLayoutOp().run(_request(host, {"1g.5gb": 7}, window=window))
    assert not same.changed
    inside = MigLayoutOp().run(
        _request(host, {"7g.40gb": 1}, window=[f"daily {now:%H}:00-{(now.hour + 1) % 24:02d}:00"])
    )
    assert inside.changed


def test_calque_gpu_mig_plan_with_drain_wait_shows_the_drain_around_the_change(
    host: Host, make_user: Callable[..., User]
) -> None:
    alice = make_user()
    _two_a100s(host)
    host.start()
    held = _checkout(host, alice, 0, "10m")
    layout = host.dir / "whole.yaml"
    layout.write_text(
        json.dumps(
            {
                "version": 1,
                "mig-configs": {"whole": [{"devices": [0], "mig-enabled": True, "mig-devices": {"7g.40gb": 1}}]},
            }
        )
    )
    args = [
        "gpu",
        "mig",
        "plan",
        "--config",
        str(layout),
        "--gpu-backend",
        "sim",
        "--sim-state",
        str(host.sim.state_path),
    ]
    args += ["--session-socket", str(host.socket), "--json"]
    plan = json.loads(host.cli(None, *args, "--drain-wait", "1h", check=True).stdout)
    assert plan["actions"][0] == "GPU 0: drain (no new checkouts while its layout changes)"
    assert plan["actions"][-1] == "GPU 0: undrain" and plan["result"]["refusal"] is None
    refused = host.cli(None, *args, "--drain-wait", "1m")
    assert refused.returncode == 4, refused.stderr  # as the real run would exit
    short = json.loads(refused.stdout)
    assert held["id"] in short["result"]["refusal"] and "drain wait of 60 s" in short["result"]["refusal"]
    assert short["failure"]["message"] == "the real run will be refused: " + short["result"]["refusal"]
    assert host.client().drains() == []  # a plan drains nothing
