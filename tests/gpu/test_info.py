"""``calque gpu info``: one view of GPUs, MIG devices, processes, MPS daemons and catalog entries."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from calque.cli.main import run
from calque.gpu.sim import SimGpu

Make = Callable[..., SimGpu]


def test_info_reports_devices_processes_and_catalog(
    make_sim: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = make_sim(["A100-40GB", "L4-24GB"], mig=True)
    dev = sim.create_instances(0, ["3g.20gb"])[0]
    sim.set_processes(dev.uuid, [101, 102])
    sim.add_process(sim.gpus()[1].uuid, 7)
    cfg = tmp_path / "host.yaml"
    cfg.write_text(f"gpu: {{backend: sim, sim: {{state: {sim.state_path}}}}}\n")
    monkeypatch.setenv("CALQUE_HOST_CONFIG", str(cfg))
    assert run(["gpu", "info", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    a100, l4 = facts["gpus"]
    assert a100["gpu"]["mig_current"] is True and a100["catalog"]["key"] == "A100-40GB"
    assert a100["mig_devices"][0]["uuid"] == dev.uuid
    assert a100["gpu_instances"][0]["compute_instances"][0]["uuid"] == dev.uuid
    assert sorted(p["pid"] for p in a100["processes"]) == [101, 102]
    assert [p["pid"] for p in l4["processes"]] == [7] and l4["catalog"]["mig"] is False
    assert run(["gpu", "info"]) == 0
    out = capsys.readouterr().out
    assert f"3g.20gb@{dev.placement_start}" in out and "pids [101, 102]" in out
