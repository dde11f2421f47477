"""GPU layer edge cases: a pending MIG change, missing GPU indexes, on/off config names, mig-parted files.

Every test runs the real CLI (``calque.cli.main.run``) or the planner against a simulated host whose
state lives in a real state file, and checks what a person would see.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from calque.cli.main import run
from calque.errors import UsageError
from calque.gpu.layout import load_layout
from calque.gpu.nvml import NvmlBackend
from calque.gpu.planner import MigPlanner
from calque.gpu.sim import SimGpu

from gpu.fake_pynvml import FakePynvml, card_from_catalog

DATA = Path(__file__).resolve().parent / "data"
MIG_PARTED = DATA / "mig-parted-v1.yaml"
BALANCED = ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]

LAYOUTS = """\
version: 1
mig-configs:
  off:
    - devices: all
      mig-enabled: false
  on:
    - devices: all
      mig-enabled: true
      mig-devices: {3g.20gb: 1, 2g.10gb: 1, 1g.5gb: 2}
  typo:
    - devices: [0, 3]
      mig-enabled: true
      mig-devices: {1g.5gb: 7}
"""


Point = Callable[[SimGpu], SimGpu]


@pytest.fixture
def host(tmp_path: Path, point_host_config: Point) -> SimGpu:
    """A one-GPU A100 host selected by the host configuration, MIG on, and a layout file beside it."""
    (tmp_path / "mig.yaml").write_text(LAYOUTS)
    return point_host_config(SimGpu.create(tmp_path / "gpus.json", ["A100-40GB"], mig=True))


def _json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    assert run([*args, "--json"]) == 0, capsys.readouterr().err
    out: dict = json.loads(capsys.readouterr().out)  # type: ignore[type-arg]
    return out


def test_a_pending_mig_disable_never_locks_the_cli(
    host: SimGpu, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = str(tmp_path / "mig.yaml")
    host.create_instances(0, ["3g.20gb"])
    assert run(["gpu", "mig", "apply", "--config", layout, "--select", "off"]) == 0
    assert "pending a GPU reset" in capsys.readouterr().err
    g = host.gpus()[0]
    assert (g.mig_current, g.mig_pending) == (True, False)

    shown = _json(["gpu", "mig", "show"], capsys)["gpus"][0]
    assert (shown["mig_current"], shown["mig_pending"]) == (True, False)
    assert run(["gpu", "mig", "show"]) == 0
    assert "on (pending off: reset needed)" in capsys.readouterr().out
    info = _json(["gpu", "info"], capsys)["gpus"][0]["gpu"]
    assert (info["mig_current"], info["mig_pending"]) == (True, False)

    # planning the other way cancels the pending disable: no reset, MIG is still current
    back = _json(["gpu", "mig", "plan", "--config", layout, "--select", "on"], capsys)
    assert back["before"]["gpu0"]["mig_pending"] is False
    assert back["pending"] is None and back["result"]["reset_required"] is False
    assert back["actions"][0] == "GPU 0: cancel the pending MIG mode change (MIG stays on)"
    assert run(["gpu", "mig", "plan", "--config", layout, "--select", "on"]) == 0
    out = capsys.readouterr().out
    assert "cancel the pending MIG mode change" in out and "(MIG off pending a reset)" in out

    # the command the error recommends completes it
    done = _json(["gpu", "mig", "apply", "--config", layout, "--select", "off", "--allow-reset"], capsys)
    assert done["changed"] is True and done["result"]["reset_required"] is False
    g = host.gpus()[0]
    assert (g.mig_current, g.mig_pending) == (False, False)


def test_a_pending_mig_enable_is_shown_and_planned_around(
    tmp_path: Path, point_host_config: Point, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mig.yaml").write_text(LAYOUTS)
    sim = point_host_config(SimGpu.create(tmp_path / "gpus.json", ["A100-40GB"]))
    sim.set_mig_mode(0, True)
    assert run(["gpu", "mig", "show"]) == 0
    assert "off (pending on: reset needed)" in capsys.readouterr().out
    assert run(["gpu", "info"]) == 0
    assert "MIG off (pending on)" in capsys.readouterr().out
    plan = _json(["gpu", "mig", "plan", "--config", str(tmp_path / "mig.yaml"), "--select", "off"], capsys)
    assert plan["actions"] == ["GPU 0: cancel the pending MIG mode change (MIG stays off)"]
    assert plan["pending"] is None and not plan["result"]["reset_required"]
    layout = str(tmp_path / "mig.yaml")
    done = _json(["gpu", "mig", "apply", "--config", layout, "--select", "on", "--allow-reset"], capsys)
    assert len(done["result"]["mig_devices"]) == 4


def test_a_layout_naming_a_missing_gpu_index_fails_before_any_change(
    host: SimGpu, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = host.state()
    assert run(["gpu", "mig", "apply", "--config", str(tmp_path / "mig.yaml"), "--select", "typo"]) == 2
    err = capsys.readouterr().err
    assert "names GPU 3, which this host does not have (its GPU indexes: 0)" in err
    assert run(["gpu", "mig", "plan", "--config", str(tmp_path / "mig.yaml"), "--select", "typo", "--json"]) == 2
    error = json.loads(capsys.readouterr().err)["error"]
    assert error["kind"] == "usage" and error["exit_code"] == 2 and "names GPU 3" in error["message"]
    assert host.state() == before


def test_config_names_on_and_off_are_read_as_written(
    host: SimGpu, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layouts = load_layout(tmp_path / "mig.yaml")
    assert list(layouts.mig_configs) == ["off", "on", "typo"]
    plan = _json(["gpu", "mig", "plan", "--config", str(tmp_path / "mig.yaml"), "--select", "on"], capsys)
    assert plan["after"]["gpu0"]["mig_enabled"] is True and len(plan["after"]["gpu0"]["instances"]) == 4
    # what an unquoted `select: off` in a playbook becomes by the time calque sees it
    assert run(["gpu", "mig", "plan", "--config", str(tmp_path / "mig.yaml"), "--select", "False"]) == 2
    assert "quote the name" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("config", "want"),
    [
        ("all-disabled", {0: [], 1: []}),
        ("all-enabled", {0: [], 1: []}),
        ("all-1g.5gb", {0: ["1g.5gb"] * 7, 1: ["1g.5gb"] * 7}),
        ("all-1g.5gb.me", {0: ["1g.5gb+me"], 1: ["1g.5gb+me"]}),
        (
            "all-balanced",
            {0: ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]} | {1: ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]},
        ),
        ("per-gpu", {0: ["3g.20gb", "3g.20gb"], 1: []}),
    ],
)
def test_mig_parted_v1_files_apply_as_mig_parted_reads_them(
    tmp_path: Path, config: str, want: dict[int, list[str]]
) -> None:
    sim = SimGpu.create(tmp_path / "gpus.json", ["A100-40GB"] * 2)
    name, entries = load_layout(MIG_PARTED).select(config)
    planner = MigPlanner(sim)
    planner.apply(planner.plan(entries, config=name), allow_reset=True)
    got = {i: sorted(d.profile for d in sim.mig_devices() if d.gpu_index == i) for i in (0, 1)}
    assert got == {i: sorted(v) for i, v in want.items()}
    enabled = "disabled" not in config and config != "per-gpu"
    assert sim.gpus()[0].mig_current is (config != "all-disabled")
    assert sim.gpus()[1].mig_current is enabled
    assert not planner.plan(entries, config=name).changes


def test_mig_parted_compute_instance_keys_become_compute_splits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], point_host_config: Point
) -> None:
    point_host_config(SimGpu.create(tmp_path / "gpus.json", ["A100-40GB", "H100-80GB"], mig=True))
    done = _json(["gpu", "mig", "apply", "--config", str(MIG_PARTED), "--select", "split-3g"], capsys)
    devs = [d for d in done["result"]["mig_devices"] if d["gpu_index"] == 0]
    assert len(devs) == 6 and {d["ci_profile"] for d in devs} == {"1c.3g.20gb"}
    assert not [d for d in done["result"]["mig_devices"] if d["gpu_index"] == 1]  # the PCI filter names only the A100


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('{devices: all, mig-enabled: true, mig-devices: {"1c.3g.20gb": 4}}', "do not fill whole 3g.20gb"),
        ('{devices: all, mig-enabled: false, mig-devices: {"1g.5gb": 1}}', "mig-enabled is false"),
        ('{devices: all, mig-enabled: true, mig-devices: {"3g.20gb": 1, "1c.3g.20gb": 3}}', "give each"),
    ],
)
def test_mig_parted_entries_calque_cannot_express_get_a_sentence(tmp_path: Path, entry: str, message: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(f"version: v1\nmig-configs:\n  x:\n    - {entry}\n")
    with pytest.raises(UsageError, match=message):
        load_layout(f)


def test_an_unknown_layout_version_names_both_readable_versions(tmp_path: Path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text("version: v2\nmig-configs:\n  x:\n    - {devices: all, mig-enabled: false}\n")
    with pytest.raises(UsageError, match="version 1 \\(calque\\) and version v1 \\(NVIDIA mig-parted\\)"):
        load_layout(f)


def test_nvml_backend_reads_instances_while_a_disable_is_pending() -> None:
    """The NVML side of the same rule: nvmlDeviceGetMigMode gives (current, pending); MIG calls follow current."""
    fake = FakePynvml([card_from_catalog("A100-40GB", 0, mig=True)])
    b = NvmlBackend(fake)
    gi = b.create_gpu_instance(0, 9, 4)
    b.create_compute_instance(0, gi.gi_id, 3)
    fake.cards[0].mig[1] = 0  # type: ignore[index]  # a disable left pending
    (g,) = b.gpus()
    assert (g.mig_current, g.mig_pending) == (True, False)
    (inst,) = b.gpu_instances(0)
    assert inst.profile == "3g.20gb"
    plan = MigPlanner(b).plan(load_layout(MIG_PARTED).select("all-disabled")[1])
    assert [op.kind for op in plan.gpus[0].ops] == ["destroy_ci", "destroy_gi", "reset"]
