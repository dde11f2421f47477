"""``calque gpu mig show|plan|apply`` against a simulated host selected by the host configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from calque.cli.main import run
from calque.gpu.sim import SimGpu

LAYOUTS = """\
version: 1
mig-configs:
  balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {3g.20gb: 1, 2g.10gb: 1, 1g.5gb: 2}
  too-many:
    - devices: all
      mig-enabled: true
      mig-devices: {3g.20gb: 3}
"""


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimGpu:
    cfg = tmp_path / "host.yaml"
    cfg.write_text(f"gpu:\n  backend: sim\n  sim: {{state: {tmp_path}/gpus.json, cards: [A100-40GB]}}\n")
    monkeypatch.setenv("CALQUE_HOST_CONFIG", str(cfg))
    (tmp_path / "mig.yaml").write_text(LAYOUTS)
    return SimGpu.create(tmp_path / "gpus.json", ["A100-40GB"])


def test_plan_changes_nothing_and_apply_needs_an_allowed_reset(
    host: SimGpu, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(tmp_path / "mig.yaml")
    assert run(["gpu", "mig", "plan", "--config", cfg, "--select", "balanced", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["check_mode"] is True and plan["pending"] == "reset"
    assert host.gpus()[0].mig_pending is False
    assert run(["gpu", "mig", "apply", "--config", cfg, "--select", "balanced"]) == 0
    captured = capsys.readouterr()
    assert "reset" in captured.err and host.gpus()[0].mig_pending is True
    assert run(["gpu", "mig", "apply", "--config", cfg, "--select", "balanced", "--allow-reset", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["result"]["mig_devices"]) == 4 and result["changed"] is True
    assert run(["gpu", "mig", "apply", "--config", cfg, "--select", "balanced", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["changed"] is False
    assert run(["gpu", "mig", "show"]) == 0
    assert "3g.20gb@" in capsys.readouterr().out


def test_a_layout_that_cannot_fit_exits_2_naming_valid_profiles(
    host: SimGpu, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["gpu", "mig", "apply", "--config", str(tmp_path / "mig.yaml"), "--select", "too-many"]) == 2
    err = capsys.readouterr().err
    assert "3g.20gb (max 2)" in err and "1g.5gb (max 7)" in err


def test_busy_instances_refuse_with_exit_4(host: SimGpu, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host.enable_mig()
    dev = host.create_instances(0, ["7g.40gb"])[0]
    host.set_processes(dev.uuid, [31337])
    assert run(["gpu", "mig", "apply", "--config", str(tmp_path / "mig.yaml"), "--select", "balanced"]) == 4
    assert "31337" in capsys.readouterr().err


def test_plan_warns_without_force_and_with_force_lists_the_processes_it_stops(
    host: SimGpu, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host.enable_mig()
    dev = host.create_instances(0, ["7g.40gb"])[0]
    host.set_processes(dev.uuid, [31337])
    cfg = ["--config", str(tmp_path / "mig.yaml"), "--select", "balanced", "--session-socket", str(tmp_path / "none")]
    # check mode predicts the refused real run: exit 4 with the refusal naming the pid and the variable,
    # nothing planned, the layout asked for beside the one there is
    assert run(["gpu", "mig", "plan", *cfg, "--json"]) == 4
    captured = capsys.readouterr()
    plan = json.loads(captured.out)
    assert plan["changed"] is False and plan["actions"] == [] and plan["after"] == plan["before"]
    assert plan["result"]["requested"]["gpu0"]["instances"] != plan["before"]["gpu0"]["instances"]
    assert "the real run will be refused" in captured.err and "31337" in captured.err
    assert "calque_gpu_layout_force" in plan["result"]["refusal"]
    assert plan["failure"]["exit_code"] == 4 and plan["result"]["refusal"] in plan["failure"]["message"]
    # the human plan with --force says which processes it stops, as --json does
    assert run(["gpu", "mig", "plan", *cfg, "--force"]) == 0
    human = capsys.readouterr().out
    assert "GPU 0: 7g.40gb@0 (GI " in human and "): stop pids [31337]" in human
    assert run(["gpu", "mig", "plan", *cfg, "--force", "--json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert [b["pids"] for b in as_json["result"]["stopped_processes"]] == [[31337]]
    assert any("stop pids [31337]" in a for a in as_json["actions"])
