"""calque.gpu.mig, calque.gpu.mps and calque.gpu.gpu_info through real ansible-playbook against the simulator."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from calque.gpu.sim import SimGpu
from support.ansible import run_playbook

Make = Callable[..., SimGpu]
pytestmark = pytest.mark.slow

MIXED = [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}}]


def test_mig_module_check_diff_apply_idempotent_and_bad_layout(make_sim: Make, tmp_path: Path) -> None:
    sim = make_sim(["A100-40GB", "A100-40GB"], mig=True)
    sim.create_instances(0, ["1g.5gb"] * 7)
    sim.create_instances(1, ["1g.5gb"] * 7)
    before = sim.state()
    common = {"sim_state": str(sim.state_path), "layout": MIXED}
    host_yaml = tmp_path / "host.yaml"  # the other way to select the simulator: a host configuration
    host_yaml.write_text(f"gpu: {{backend: sim, sim: {{state: {sim.state_path}}}}}\n")
    tasks = [
        {"name": "plan", "calque.gpu.mig": common, "check_mode": True},
        {"name": "apply", "calque.gpu.mig": common},
        {"name": "again", "calque.gpu.mig": common},
        {
            "name": "bad",
            "calque.gpu.mig": {
                **common,
                "layout": [{"devices": 0, "mig-enabled": True, "mig-devices": {"3g.20gb": 3}}],
            },
            "ignore_errors": True,
        },
        {"name": "facts", "calque.gpu.gpu_info": {"host_config": str(host_yaml)}},
    ]
    run = run_playbook(tmp_path, tasks, diff=True)
    assert run.rc == 0, run.stdout[-3000:] + run.stderr[-3000:]
    plan = run.task("plan")
    assert plan["changed"] is True and any("create 3g.20gb" in s for s in plan["plan"])
    assert len(plan["mig_devices"]) == 14  # check mode: nothing changed yet
    assert plan["diff"]["before"]["gpu0"]["instances"][0] == "1g.5gb@0"
    assert "3g.20gb@4" in plan["diff"]["after"]["gpu0"]["instances"]
    apply = run.task("apply")
    assert apply["changed"] is True and apply["reset_required"] is False
    assert sorted({d["profile"] for d in apply["mig_devices"]}) == ["1g.5gb", "2g.10gb", "3g.20gb"]
    assert {"gpu_index", "placement_start", "gi_id", "ci_id", "uuid"} <= set(apply["mig_devices"][0])
    assert apply["diff"]["after"]["gpu1"]["instances"] == plan["diff"]["after"]["gpu1"]["instances"]
    assert run.task("again")["changed"] is False
    bad = run.task("bad")
    assert bad["failed"] is True and "3g.20gb (max 2)" in bad["msg"] and "1g.5gb (max 7)" in bad["msg"]
    facts = run.task("facts")
    assert facts["changed"] is False and len(facts["gpus"][0]["mig_devices"]) == 4
    assert facts["gpus"][0]["catalog"]["key"] == "A100-40GB" and facts["backend"] == "SimGpu"
    assert before.cards[0].gis != sim.state().cards[0].gis


def test_mig_module_reports_a_needed_reset_until_allowed(make_sim: Make, tmp_path: Path) -> None:
    sim = make_sim(["H100-80GB"])
    layout = [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]
    config = tmp_path / "layouts.yaml"
    config.write_text(
        "version: 1\nmig-configs:\n  small:\n    - {devices: all, mig-enabled: true, mig-devices: {1g.10gb: 7}}\n"
    )
    tasks = [
        {"name": "pending", "calque.gpu.mig": {"sim_state": str(sim.state_path), "layout": layout}},
        {"name": "still", "calque.gpu.mig": {"sim_state": str(sim.state_path), "layout": layout}},
        {
            "name": "reset",
            "calque.gpu.mig": {"sim_state": str(sim.state_path), "config": str(config), "allow_reset": True},
        },
    ]
    run = run_playbook(tmp_path, tasks)
    assert run.rc == 0, run.stdout[-3000:]
    assert run.task("pending")["changed"] is True and run.task("pending")["reset_required"] is True
    assert run.task("still")["changed"] is False and run.task("still")["reset_required"] is True
    done = run.task("reset")
    assert done["changed"] is True and len(done["mig_devices"]) == 7 and done["reset_required"] is False


def test_mps_module_consent_check_mode_limits_and_idempotence(make_sim: Make, mps_env: Path, tmp_path: Path) -> None:
    sim = make_sim(["L4-24GB", "L4-24GB"])
    base = {
        "sim_state": str(sim.state_path),
        "pipe_root": str(mps_env / "pipe"),
        "log_root": str(mps_env / "log"),
        "active_thread_percentage": 40,
        "pinned_memory_limit": "2G",
    }
    ok = {**base, "i_understand_shared_gpu_has_no_isolation": True}
    tasks = [
        {"name": "no consent", "calque.gpu.mps": base, "ignore_errors": True},
        {"name": "check", "calque.gpu.mps": ok, "check_mode": True},
        {"name": "start", "calque.gpu.mps": ok},
        {"name": "again", "calque.gpu.mps": ok},
        {"name": "stop", "calque.gpu.mps": {**ok, "state": "stopped"}},
    ]
    run = run_playbook(tmp_path, tasks, diff=True, extra_env={"PATH": os.environ["PATH"]})
    assert run.rc == 0, run.stdout[-3000:]
    refused = run.task("no consent")
    assert refused["failed"] is True and refused["calque_exit_code"] == 4
    assert "i_understand_shared_gpu_has_no_isolation" in refused["msg"]
    check = run.task("check")
    assert check["changed"] is True and not any(d["running"] for d in check["daemons"])
    assert check["diff"]["after"]["gpu0"]["running"] is True
    start = run.task("start")
    assert [(d["running"], d["active_thread_percentage"], d["pinned_memory_limit"]) for d in start["daemons"]] == [
        (True, 40, "2G"),
        (True, 40, "2G"),
    ]
    assert run.task("again")["changed"] is False
    assert run.task("stop")["changed"] is True
    assert {g.compute_mode for g in sim.gpus()} == {"DEFAULT"}


def test_mig_module_applies_mig_parted_files_and_a_pending_disable_completes(make_sim: Make, tmp_path: Path) -> None:
    """The layout files the gpu_layout role feeds the module: mig-parted's v1 format, `off` quoted,
    the backend named in the shared vocabulary; a disable left pending is completed by allow_reset."""
    sim = make_sim(["A100-40GB"], mig=True)
    mig_parted = Path(__file__).resolve().parent / "data" / "mig-parted-v1.yaml"
    own = tmp_path / "layouts.yaml"
    own.write_text("version: 1\nmig-configs:\n  'off':\n    - {devices: all, mig-enabled: false}\n")
    use = {"gpu_backend": "sim", "sim_state": str(sim.state_path)}
    tasks = [
        {"name": "split", "calque.gpu.mig": {**use, "config": str(mig_parted), "select": "split-3g"}},
        {"name": "empty", "calque.gpu.mig": {**use, "config": str(mig_parted), "select": "all-enabled"}},
        {"name": "pending", "calque.gpu.mig": {**use, "config": str(own), "select": "off"}},
        {"name": "unquoted", "calque.gpu.mig": {**use, "config": str(own), "select": False}, "ignore_errors": True},
        {"name": "complete", "calque.gpu.mig": {**use, "config": str(own), "select": "off", "allow_reset": True}},
    ]
    run = run_playbook(tmp_path, tasks)
    assert run.rc == 0, run.stdout[-3000:]
    split = run.task("split")
    assert split["changed"] is True and {d["ci_profile"] for d in split["mig_devices"]} == {"1c.3g.20gb"}
    assert len(split["mig_devices"]) == 6
    assert run.task("empty")["mig_devices"] == []
    pending = run.task("pending")
    assert pending["changed"] is True and pending["reset_required"] is True
    assert "quote the name" in run.task("unquoted")["msg"]
    assert run.task("complete")["changed"] is True and run.task("complete")["reset_required"] is False
    assert (sim.gpus()[0].mig_current, sim.gpus()[0].mig_pending) == (False, False)
