"""``calque gpu sim ...`` and the one GPU-backend vocabulary the CLI, modules and session config share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from calque.cli.main import run
from calque.gpu.selection import BACKENDS, GpuSelection, open_reader
from calque.gpu.sim import SimGpu
from calque.session.session_config import SessionConfig
from calque.session.slices import load_reader

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "collections/ansible_collections/calque/gpu/plugins"
MIG_PARTED = Path(__file__).resolve().parent / "data" / "mig-parted-v1.yaml"


def _out(args: list[str], capsys: pytest.CaptureFixture[str], code: int = 0) -> str:
    assert run(args) == code, capsys.readouterr().err
    return capsys.readouterr().out


def test_a_person_can_try_a_layout_by_hand_on_a_simulated_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = ["--sim-state", str(tmp_path / "gpus.json")]
    made = json.loads(_out(["gpu", "sim", "create", "--card", "A100-40GB", "--mig", "--json", *state], capsys))
    assert [(c["card"], c["mig_current"]) for c in made["cards"]] == [("A100-40GB", True)]
    layout = ["--config", str(MIG_PARTED), "--select", "all-balanced", *state]
    assert "changed" in _out(["gpu", "mig", "apply", *layout], capsys)
    # a process on the 3g instance makes it busy: a layout that would destroy it is refused
    shown = _out(["gpu", "sim", "add-process", "0:3g.20gb@4", "--pid", "4242", "--memory", "512", *state], capsys)
    assert "4242" in shown and "3g.20gb@4" in shown
    busy = SimGpu(tmp_path / "gpus.json").processes()
    assert [(p.pid, p.used_memory_mib) for p in busy] == [(4242, 512)]
    seven = ["--config", str(MIG_PARTED), "--select", "all-1g.5gb", *state]
    assert run(["gpu", "mig", "apply", *seven]) == 4
    assert "busy instances" in capsys.readouterr().err
    _out(["gpu", "sim", "remove-process", "--pid", "4242", *state], capsys)
    assert "changed" in _out(["gpu", "mig", "apply", *seven], capsys)
    assert len(SimGpu(tmp_path / "gpus.json").mig_devices()) == 7


def test_sim_reboot_makes_a_pending_mode_current(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = ["--sim-state", str(tmp_path / "gpus.json")]
    _out(["gpu", "sim", "create", "--instance-type", "p4d.24xlarge", *state], capsys)
    assert run(["gpu", "mig", "apply", "--config", str(MIG_PARTED), "--select", "all-enabled", *state]) == 0
    capsys.readouterr()
    assert "off (pending on)" in _out(["gpu", "sim", "show", *state], capsys)
    after = json.loads(_out(["gpu", "sim", "reboot", "--json", *state], capsys))
    assert all(c["mig_current"] and c["mig_pending"] for c in after["cards"]) and len(after["cards"]) == 8


def test_sim_persistence_blocks_the_reset_an_apply_needs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = ["--sim-state", str(tmp_path / "gpus.json")]
    _out(["gpu", "sim", "create", "--card", "H100-80GB", *state], capsys)
    _out(["gpu", "sim", "persistence", "0", "on", *state], capsys)
    layout = ["--config", str(MIG_PARTED), "--select", "all-enabled", "--allow-reset", *state]
    assert run(["gpu", "mig", "apply", *layout]) == 1
    assert "persistence" in capsys.readouterr().err


def test_sim_create_refuses_to_overwrite_and_names_what_to_give(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state = ["--sim-state", str(tmp_path / "gpus.json")]
    _out(["gpu", "sim", "create", "--card", "L4-24GB", *state], capsys)
    assert run(["gpu", "sim", "create", "--card", "L4-24GB", *state]) == 2
    assert "--replace" in capsys.readouterr().err
    monkeypatch.setenv("CALQUE_HOST_CONFIG", str(tmp_path / "host.yaml"))
    (tmp_path / "host.yaml").write_text("gpu: {backend: nvml}\n")
    assert run(["gpu", "sim", "show"]) == 2
    assert "--sim-state" in capsys.readouterr().err


def test_the_host_config_names_the_simulated_host_for_sim_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "host.yaml").write_text(f"gpu: {{backend: sim, sim: {{state: {tmp_path}/g.json}}}}\n")
    monkeypatch.setenv("CALQUE_HOST_CONFIG", str(tmp_path / "host.yaml"))
    _out(["gpu", "sim", "create", "--card", "A30-24GB", "--mig"], capsys)
    assert "A30-24GB" in _out(["gpu", "info"], capsys)


def test_one_backend_vocabulary_for_cli_modules_and_session_config(tmp_path: Path) -> None:
    assert BACKENDS == ("host", "nvml", "sim", "none")
    # modules: the same words (none has no meaning for a module that changes GPUs)
    doc = (PLUGINS / "doc_fragments/gpu_backend.py").read_text()
    options = yaml.safe_load(doc.split('DOCUMENTATION = r"""', 1)[1].split('"""', 1)[0])["options"]
    assert options["gpu_backend"]["choices"] == [b for b in BACKENDS if b != "none"]
    assert set(options) == {"gpu_backend", "host_config", "sim_state"}
    assert '"host", "nvml", "sim"' in (PLUGINS / "module_utils/_gpu.py").read_text()
    # session config: the same words, and the same resolver
    sim = SimGpu.create(tmp_path / "g.json", ["A100-40GB"])
    cfg = SessionConfig.model_validate({"gpu_backend": "sim", "sim_state": str(sim.state_path)})
    reader = load_reader(cfg)
    assert isinstance(reader, SimGpu) and reader.state_path == sim.state_path
    old = SessionConfig.model_validate({"gpu_backend": "sim", "gpu_state": str(sim.state_path)})
    assert old.sim_state == sim.state_path  # the name before the vocabulary was shared still reads
    assert load_reader(SessionConfig.model_validate({"gpu_backend": "none"})) is None
    # sim_state alone means sim; host follows the host configuration
    assert isinstance(open_reader(GpuSelection(sim_state=sim.state_path)), SimGpu)
    host = tmp_path / "host.yaml"
    host.write_text(f"gpu: {{backend: sim, sim: {{state: {sim.state_path}}}}}\n")
    via_host = SessionConfig.model_validate({"gpu_backend": "host", "host_config": str(host)})
    assert isinstance(load_reader(via_host), SimGpu)


def test_session_serve_offers_every_backend_word() -> None:
    from calque.cli.session import serve

    choice = next(p for p in serve.params if p.name == "gpu_backend")
    assert tuple(choice.type.choices) == BACKENDS  # type: ignore[attr-defined]
    assert {"sim_state", "host_config"} <= {p.name for p in serve.params}
