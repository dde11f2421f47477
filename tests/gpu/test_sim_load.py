"""The simulator's utilisation (``calque gpu sim load``): busy, idle and unknown slices, as NVML reports them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from calque.cli.main import run
from calque.gpu.sim import SimGpu
from calque.quantities import QuantityError, parse_mib, parse_percent


def _out(args: list[str], capsys: pytest.CaptureFixture[str], code: int = 0) -> str:
    assert run(args) == code, capsys.readouterr().err
    return capsys.readouterr().out


def test_a_slice_is_unknown_until_load_is_set_then_idle_or_busy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = ["--sim-state", str(tmp_path / "gpus.json")]
    _out(["gpu", "sim", "create", "--card", "H100-80GB", "--card", "L4-24GB", "--mig", *state], capsys)
    sim = SimGpu(tmp_path / "gpus.json")
    a, b = sim.create_instances(0, ["1g.10gb", "1g.10gb"])
    sim.add_process(a.uuid, 4242, used_memory_mib=700)
    first = {s.device_uuid: s for s in sim.utilisation()}
    assert first[a.uuid].kind == "mig" and first[a.uuid].active_percent is None  # nothing set: unknown
    assert first[a.uuid].memory_used_mib == 700  # from its processes
    shown = _out(["gpu", "sim", "load", "--device", a.uuid, "--util", "0.0", "--memory", "2GiB", *state], capsys)
    assert a.uuid in shown and "0%" in shown
    _out(["gpu", "sim", "load", "--device", "0:1g.10gb@1", "--util", "35%", "--json", *state], capsys)
    now = {s.device_uuid: s for s in sim.utilisation()}
    assert (now[a.uuid].active_percent, now[a.uuid].memory_used_mib, now[a.uuid].source) == (0.0, 2048, "sim")
    assert now[b.uuid].active_percent == 35.0
    _out(["gpu", "sim", "load", "--device", a.uuid, "--util", "unknown", *state], capsys)
    assert {s.device_uuid: s for s in sim.utilisation()}[a.uuid].active_percent is None


def test_mps_clients_get_their_own_samples_on_a_whole_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sim = SimGpu.create(tmp_path / "gpus.json", ["L4-24GB"])
    gpu = sim.gpus()[0].uuid
    sim.add_process(gpu, 10, 100)
    sim.add_process(gpu, 11, 200)
    state = ["--sim-state", str(tmp_path / "gpus.json")]
    _out(["gpu", "sim", "load", "--device", "0", "--pid", "10", "--util", "0.8", *state], capsys)
    procs = {s.pid: s for s in sim.utilisation() if s.kind == "process"}
    assert procs[10].active_percent == 80.0 and procs[11].active_percent is None
    assert procs[11].memory_used_mib == 200 and procs[10].device_uuid == gpu


def test_bad_load_is_refused_with_a_sentence_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = ["--sim-state", str(tmp_path / "gpus.json")]
    _out(["gpu", "sim", "create", "--card", "A100-40GB", "--mig", *state], capsys)
    sim = SimGpu(tmp_path / "gpus.json")
    (a,) = sim.create_instances(0, ["3g.20gb"])
    before = sim.state()
    assert run(["gpu", "sim", "load", "--device", a.uuid, "--util", "5", *state]) == 2
    assert "ambiguous" in capsys.readouterr().err
    assert run(["gpu", "sim", "load", "--device", "MIG-nope", "--util", "0.1", *state]) != 0
    assert "no GPU or MIG device" in capsys.readouterr().err
    assert run(["gpu", "sim", "load", "--device", a.uuid, "--pid", "3", "--util", "0.1", *state]) != 0
    assert "per-process" in capsys.readouterr().err
    assert sim.state() == before
    assert json.loads(_out(["gpu", "sim", "show", "--json", *state], capsys))["load"] == {}


def test_shares_and_sizes_read_as_people_write_them() -> None:
    assert parse_percent("5%") == parse_percent(0.05) == pytest.approx(5.0)
    assert parse_mib("2GiB") == 2048 and parse_mib("512") == 512 and parse_mib("1.5G") == 1536
    for bad in ("5", "-1%", "120%", "x", True):
        with pytest.raises(QuantityError):
            parse_percent(bad)  # type: ignore[arg-type]
    with pytest.raises(QuantityError):
        parse_mib("2 parsecs")
