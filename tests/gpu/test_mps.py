"""MPS daemons through the fake control program: a daemon per GPU, limits sent, consent enforced."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from calque.cli.main import run
from calque.errors import InfrastructureError, RefusedError, UsageError
from calque.gpu.mps_control import MpsControl
from calque.gpu.sim import SimGpu
from calque.models.mps import MpsSettings

Make = Callable[..., SimGpu]


def control(sim: SimGpu, root: Path) -> MpsControl:
    return MpsControl(sim, pipe_root=root / "pipe", log_root=root / "log")


def test_start_runs_one_daemon_per_gpu_with_limits_and_exclusive_mode(make_sim: Make, mps_env: Path) -> None:
    sim = make_sim(["L4-24GB", "L4-24GB"])
    ctl = control(sim, mps_env)
    res = ctl.start(MpsSettings(active_thread_percentage=25, pinned_memory_limit="4G"), consent=True)
    assert res.changed
    assert [(d.target, d.running, d.active_thread_percentage, d.pinned_memory_limit) for d in res.daemons] == [
        ("gpu0", True, 25, "4G"),
        ("gpu1", True, 25, "4G"),
    ]
    assert {g.compute_mode for g in sim.gpus()} == {"EXCLUSIVE_PROCESS"}
    log = (mps_env / "log/gpu1/control.log").read_text()
    assert f"CUDA_VISIBLE_DEVICES={sim.gpus()[1].uuid}" in log
    assert "cmd set_default_active_thread_percentage 25" in log
    assert "cmd set_default_device_pinned_mem_limit 0 4G" in log
    assert ctl.env("gpu0")["CUDA_MPS_PIPE_DIRECTORY"] == str(mps_env / "pipe/gpu0")


def test_start_is_idempotent_and_only_sends_changed_limits(make_sim: Make, mps_env: Path) -> None:
    sim = make_sim(["L40S-48GB"])
    ctl = control(sim, mps_env)
    ctl.start(MpsSettings(active_thread_percentage=50), consent=True)
    again = ctl.start(MpsSettings(active_thread_percentage=50), consent=True)
    assert again.changed is False and again.actions == []
    check = ctl.start(MpsSettings(active_thread_percentage=30), consent=True, check=True)
    assert check.changed and check.actions == ["gpu0: set_default_active_thread_percentage 30"]
    assert check.daemons[0].active_thread_percentage == 50
    ctl.start(MpsSettings(active_thread_percentage=30), consent=True)
    assert ctl.status().daemons[0].active_thread_percentage == 30


def test_stop_quits_the_daemon_and_restores_default_mode(make_sim: Make, mps_env: Path) -> None:
    sim = make_sim(["A10G-24GB"])
    ctl = control(sim, mps_env)
    ctl.start(MpsSettings(), consent=True)
    res = ctl.stop(consent=True)
    assert res.changed and not res.daemons[0].running
    assert sim.gpus()[0].compute_mode == "DEFAULT"
    assert "Shutdown" in (mps_env / "log/gpu0/control.log").read_text()
    assert ctl.stop(consent=True).changed is False


def test_consent_is_required(make_sim: Make, mps_env: Path) -> None:
    sim = make_sim(["L4-24GB"])
    with pytest.raises(RefusedError, match="no memory or fault isolation") as exc:
        control(sim, mps_env).start(MpsSettings(), consent=False)
    assert exc.value.exit_code == 4
    assert control(sim, mps_env).status().daemons[0].running is False


def test_per_mig_daemons_target_mig_devices(make_sim: Make, mps_env: Path) -> None:
    sim = make_sim(["RTX-PRO-6000-Blackwell-Server-Edition"], mig=True)
    devs = sim.create_instances(0, ["2g.48gb", "2g.48gb"])
    res = control(sim, mps_env).start(MpsSettings(active_thread_percentage=50), consent=True, per_mig=True)
    assert sorted(d.device_uuid for d in res.daemons) == sorted(d.uuid for d in devs)
    assert all(d.running for d in res.daemons)
    control(sim, mps_env).stop(consent=True, per_mig=True)


def test_user_model_reports_serialisation_without_a_multi_user_option(make_sim: Make, mps_env: Path) -> None:
    model = control(make_sim(["L4-24GB"]), mps_env).user_model()
    assert model is not None and model.mode == "serialised-per-user"
    assert "one Unix user at a time" in model.slot_policy


def test_cli_mps_requires_consent_with_exit_4_and_runs_with_it(
    make_sim: Make, mps_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = make_sim(["L4-24GB"])
    cfg = tmp_path / "host.yaml"
    cfg.write_text(f"gpu: {{backend: sim, sim: {{state: {sim.state_path}}}}}\n")
    monkeypatch.setenv("CALQUE_HOST_CONFIG", str(cfg))
    dirs = ["--pipe-root", str(mps_env / "pipe"), "--log-root", str(mps_env / "log")]
    assert run(["gpu", "mps", "start", *dirs]) == 4
    assert "--i-understand-shared-gpu-has-no-isolation" in capsys.readouterr().err
    consent = "--i-understand-shared-gpu-has-no-isolation"
    assert run(["gpu", "mps", "start", "--active-thread-percentage", "20", consent, "--json", *dirs]) == 0
    assert json.loads(capsys.readouterr().out)["result"]["daemons"][0]["active_thread_percentage"] == 20
    assert run(["gpu", "mps", "status", *dirs]) == 0
    assert "running" in capsys.readouterr().out
    assert run(["gpu", "mps", "stop", consent, *dirs]) == 0
    assert run(["gpu", "mps", "unit"]) == 0
    assert "calque gpu mps start --gpus %i" in capsys.readouterr().out


def test_equal_limits_in_other_units_are_not_resent(make_sim: Make, mps_env: Path) -> None:
    ctl = control(make_sim(["L4-24GB"]), mps_env)
    ctl.start(MpsSettings(pinned_memory_limit="4096M"), consent=True)
    assert ctl.start(MpsSettings(pinned_memory_limit="4G"), consent=True).changed is False
    with pytest.raises(UsageError, match="size like 4G"):
        MpsSettings(pinned_memory_limit="four gigs")


def test_start_refuses_a_gpu_pending_a_mig_reset_or_in_mig_mode(make_sim: Make, mps_env: Path) -> None:
    sim = make_sim(["RTX-PRO-4500-Blackwell-Server-Edition", "RTX-PRO-6000-Blackwell-Server-Edition"])
    sim.set_mig_mode(0, True)
    with pytest.raises(InfrastructureError, match="pending a reset"):
        control(sim, mps_env).start(MpsSettings(), consent=True, gpus=[0])
    sim.enable_mig(1)
    with pytest.raises(UsageError, match="--per-mig"):
        control(sim, mps_env).start(MpsSettings(), consent=True, gpus=[1])
    assert not any(d.running for d in control(sim, mps_env).status().daemons)
