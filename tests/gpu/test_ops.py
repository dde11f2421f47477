"""The GPU operations' rules, each defined once in calque.ops: the MIG reboot rule and the MPS check-mode prediction."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from calque.cli.main import run
from calque.gpu.planner import GpuApplyResult, MigApplyResult
from calque.gpu.sim import SimGpu
from calque.ops.mig import REBOOT_WARNING, RESET_WARNING, MigLayoutOp, MigRequest, settle
from calque.ops.mps import MpsDaemonsOp, MpsRequest
from support.ansible import run_playbook

Make = Callable[..., SimGpu]
SEVEN = [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]


def _applied(**gpu: object) -> MigApplyResult:
    g = GpuApplyResult(index=0, **gpu)  # type: ignore[arg-type]
    return MigApplyResult(changed=True, gpus=[g], mig_devices=[], reset_required=g.reset_required,
                          reboot_required=g.reboot_required)  # fmt: skip


def test_settle_makes_a_reboot_or_an_unallowed_reset_pending_and_a_prevented_reset_a_failure() -> None:
    assert settle(_applied(reboot_required=True, blocked="cannot reset")) == ("reboot", None, [REBOOT_WARNING])
    assert settle(_applied(reset_required=True)) == ("reset", None, [RESET_WARNING])
    pending, failure, warnings = settle(_applied(reset_required=True, blocked="held by nvidia-persistenced"))
    assert pending == "reset" and warnings == []
    assert failure is not None and failure.exit_code == 1 and "GPU 0: held by nvidia-persistenced" in failure.message
    assert settle(_applied()) == (None, None, [])


def _layout_file(tmp_path: Path) -> str:
    path = tmp_path / "mig.yaml"
    path.write_text(
        "version: 1\nmig-configs:\n  seven:\n    - {devices: all, mig-enabled: true, mig-devices: {1g.10gb: 7}}\n"
    )
    return str(path)


def _host_config(tmp_path: Path, sim: SimGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "host.yaml"
    cfg.write_text(f"gpu: {{backend: sim, sim: {{state: {sim.state_path}}}}}\n")
    monkeypatch.setenv("CALQUE_HOST_CONFIG", str(cfg))


@pytest.mark.slow
def test_a_needed_reboot_is_a_pending_success_from_the_cli_and_the_module_alike(
    make_sim: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = make_sim(["H100-80GB"])
    sim.set_reset_supported(0, False)
    _host_config(tmp_path, sim, monkeypatch)
    assert run(["gpu", "mig", "apply", "--config", _layout_file(tmp_path), "--allow-reset", "--json"]) == 0
    out = capsys.readouterr()
    cli = json.loads(out.out)
    assert cli["pending"] == "reboot" and cli["failure"] is None and cli["result"]["reboot_required"] is True
    assert "reboot the host" in out.err
    task = {"sim_state": str(sim.state_path), "layout": SEVEN, "allow_reset": True}
    book = run_playbook(tmp_path, [{"name": "mig", "calque.gpu.mig": task}])
    assert book.rc == 0, book.stdout[-3000:]
    module = book.task("mig")
    assert not module.get("failed") and module["reboot_required"] is True
    assert any("reboot the host" in w for w in module.get("warnings", []))
    assert sim.gpus()[0].mig_pending is True and sim.gpus()[0].mig_current is False


def test_a_reset_something_holds_fails_with_exit_1_and_stays_pending(
    make_sim: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = make_sim(["H100-80GB"], persistence_mode=True)
    _host_config(tmp_path, sim, monkeypatch)
    outcome = MigLayoutOp().run(MigRequest(layout=SEVEN, allow_reset=True, sim_state=str(sim.state_path)))
    assert outcome.failure is not None and outcome.failure.exit_code == 1 and outcome.pending == "reset"
    assert "persistence" in outcome.failure.message
    assert run(["gpu", "mig", "apply", "--config", _layout_file(tmp_path), "--allow-reset"]) == 1
    assert "persistence" in capsys.readouterr().err


def test_mig_check_mode_is_the_plan_and_changes_nothing(make_sim: Make) -> None:
    sim = make_sim(["A100-40GB"], mig=True)
    before = sim.state()
    request = MigRequest(layout=[{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}],
                         sim_state=str(sim.state_path))  # fmt: skip
    check = MigLayoutOp().run(request, check_mode=True)
    assert check.check_mode and check.changed and check.pending is None
    assert sim.state() == before
    done = MigLayoutOp().run(request)
    assert done.after == check.after and done.actions == check.actions  # the plan is what apply did


def _mps(sim: SimGpu, root: Path, **options: object) -> MpsRequest:
    return MpsRequest(
        sim_state=str(sim.state_path),
        pipe_root=str(root / "pipe"),
        log_root=str(root / "log"),
        i_understand_shared_gpu_has_no_isolation=True,
        **options,  # type: ignore[arg-type]
    )


def test_mps_check_mode_predicts_the_after_state_that_apply_reaches(make_sim: Make, mps_env: Path) -> None:
    sim = make_sim(["L4-24GB", "L4-24GB"])
    steps = [
        {"active_thread_percentage": 40, "pinned_memory_limit": "2G"},  # start both daemons
        {"active_thread_percentage": 25},  # change one limit of running daemons
        {},  # a fresh start without limits: MPS's own default percentage
        {"state": "stopped"},
    ]
    for options in steps:
        if options == {}:
            MpsDaemonsOp().run(_mps(sim, mps_env, state="stopped"))
        request = _mps(sim, mps_env, **options)
        predicted = MpsDaemonsOp().run(request, check_mode=True)
        assert predicted.changed and predicted.check_mode
        done = MpsDaemonsOp().run(request)
        assert done.changed and done.actions == predicted.actions
        assert predicted.after == done.after, options
        assert MpsDaemonsOp().run(request).changed is False  # and it is idempotent
