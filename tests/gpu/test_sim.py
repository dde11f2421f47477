"""The simulator refuses what the driver refuses, with NVML's codes, and shares one machine across processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from calque.gpu import nvml_errors as nv
from calque.gpu.catalog import load_catalog
from calque.gpu.hostconfig import load_gpu_config, open_backend
from calque.gpu.sim import SimGpu
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.waits import HANG_S

MIG_CARDS = [k for k, c in load_catalog().cards.items() if c.mig]

Make = Callable[..., SimGpu]


def test_instance_type_gives_that_many_cards_with_stable_uuids(make_sim: Make, tmp_path: Path) -> None:
    sim = make_sim(instance_type="p4d.24xlarge")
    gpus = sim.gpus()
    assert [g.index for g in gpus] == list(range(8))
    assert {g.card for g in gpus} == {"A100-40GB"} and gpus[0].name == "NVIDIA A100-SXM4-40GB"
    other = SimGpu.create(tmp_path / "other.json", ["A100-40GB"] * 8)
    assert [g.uuid for g in other.gpus()] == [g.uuid for g in gpus]
    assert all(g.uuid.startswith("GPU-") for g in gpus)


def test_mig_mode_takes_effect_only_at_reset(make_sim: Make) -> None:
    sim = make_sim(["H100-80GB"])
    sim.set_mig_mode(0, True)
    g = sim.gpus()[0]
    assert (g.mig_current, g.mig_pending) == (False, True)
    with pytest.raises(nv.GpuNotSupported, match="pending a reset"):
        sim.create_gpu_instance(0, 19, 0)
    sim.reset_gpu(0)
    assert sim.gpus()[0].mig_current
    gi = sim.create_gpu_instance(0, 19, 3)
    assert (gi.profile, gi.placement_start) == ("1g.10gb", 3)


@pytest.mark.parametrize(
    ("hold", "error"),
    [
        (lambda s: s.set_persistence_mode(0, True), nv.GpuInUse),
        (lambda s: s.set_holders(0, ["nvidia_drm"]), nv.GpuInUse),
        (lambda s: s.add_process(s.gpus()[0].uuid, 77), nv.GpuInUse),
        (lambda s: s.set_reset_supported(0, False), nv.GpuNotSupported),
    ],
    ids=["persistence", "nvidia_drm", "process", "platform"],
)
def test_reset_is_refused_while_something_holds_the_gpu(
    make_sim: Make, hold: Callable[[SimGpu], None], error: type
) -> None:
    sim = make_sim(["A100-40GB"])
    sim.set_mig_mode(0, True)
    hold(sim)
    with pytest.raises(error) as exc:
        sim.reset_gpu(0)
    assert exc.value.exit_code == 3
    assert sim.gpus()[0].mig_current is False


def test_mig_less_card_refuses_mig_with_not_supported(make_sim: Make) -> None:
    sim = make_sim(["L4-24GB"])
    with pytest.raises(nv.GpuNotSupported, match="NVML_ERROR_NOT_SUPPORTED"):
        sim.set_mig_mode(0, True)


def test_placement_collisions_counts_and_second_me_are_refused(make_sim: Make) -> None:
    sim = make_sim(["A100-40GB"], mig=True)
    with pytest.raises(nv.GpuDriverError) as bad_start:
        sim.create_gpu_instance(0, 9, 2)  # 3g.20gb starts only at 0 or 4
    assert bad_start.value.code == nv.INVALID_ARGUMENT
    sim.create_gpu_instance(0, 9, 4)
    with pytest.raises(nv.GpuInsufficientResources, match="overlaps"):
        sim.create_gpu_instance(0, 14, 4)  # 2g.10gb inside the 3g
    sim.create_gpu_instance(0, 20, 0)  # 1g.5gb+me
    with pytest.raises(nv.GpuInsufficientResources, match="max count"):
        sim.create_gpu_instance(0, 20, 1)
    with pytest.raises(nv.GpuInsufficientResources):
        sim.create_gpu_instance(0, 9, 0)  # overlaps the +me at 0


def test_second_media_extension_profile_is_refused_on_a30(make_sim: Make) -> None:
    sim = make_sim(["A30-24GB"], mig=True)
    sim.create_gpu_instance(0, 21, 0)  # 1g.6gb+me
    with pytest.raises(nv.GpuInsufficientResources, match=r"\+me"):
        sim.create_gpu_instance(0, 6, 2)  # 2g.12gb+me


def test_destroys_are_refused_while_something_runs_inside(make_sim: Make) -> None:
    sim = make_sim(["A100-40GB"], mig=True)
    dev = sim.create_instances(0, ["3g.20gb"])[0]
    with pytest.raises(nv.GpuInUse):
        sim.destroy_gpu_instance(0, dev.gi_id)
    sim.set_processes(dev.uuid, [4242])
    with pytest.raises(nv.GpuInUse, match="4242"):
        sim.destroy_compute_instance(0, dev.gi_id, dev.ci_id)
    with pytest.raises(nv.GpuInUse):
        sim.set_mig_mode(0, False)
    sim.clear_processes()
    sim.destroy_compute_instance(0, dev.gi_id, dev.ci_id)
    sim.destroy_gpu_instance(0, dev.gi_id)
    assert sim.mig_devices() == []


def test_processes_in_mig_mode_run_on_mig_devices(make_sim: Make) -> None:
    sim = make_sim(["A100-40GB"], mig=True)
    with pytest.raises(nv.GpuDriverError, match="MIG mode"):
        sim.add_process(sim.gpus()[0].uuid, 5)
    with pytest.raises(nv.GpuNotFound):
        sim.add_process("MIG-00000000-0000-0000-0000-000000000000", 5)


def test_compute_instance_split_and_capability_files(make_sim: Make) -> None:
    sim = make_sim(["A100-40GB", "A100-40GB"], mig=True)
    devs = sim.create_instances(1, ["3g.20gb"], compute_split=[1, 2])
    assert [(d.ci_profile, d.sms) for d in devs] == [("1c.3g.20gb", 14), ("2c.3g.20gb", 28)]
    with pytest.raises(nv.GpuInsufficientResources):
        sim.create_compute_instance(1, devs[0].gi_id, 1)
    caps = sim.capability_devices(devs[1])
    gi, ci = devs[1].gi_id, devs[1].ci_id
    proc = sim.root / f"proc/driver/nvidia/capabilities/gpu1/mig/gi{gi}/ci{ci}/access"
    minor = int(proc.read_text().split("\n")[0].split(":")[1])
    assert proc.read_text().endswith("DeviceFileMode: 292\nDeviceFileModify: 1\n")
    assert caps[1] == str(sim.root / f"dev/nvidia-caps/nvidia-cap{minor}")
    assert all(Path(c).exists() for c in caps)
    sim.destroy_compute_instance(1, gi, ci)
    assert not proc.exists() and not Path(caps[1]).exists()


def test_unprivileged_changes_fail_with_no_permission(make_sim: Make) -> None:
    sim = make_sim(["A100-40GB"])
    sim.set_privileged(False)
    with pytest.raises(nv.GpuNoPermission, match="run as root"):
        sim.set_mig_mode(0, True)


def test_concurrent_processes_see_one_machine(make_sim: Make) -> None:
    sim = make_sim(["L4-24GB"])
    uuid = sim.gpus()[0].uuid
    code = (
        "import sys; from calque.gpu.sim import SimGpu\n"
        "s = SimGpu(sys.argv[1])\n"
        "for i in range(10): s.add_process(sys.argv[2], int(sys.argv[3]) * 100 + i + 1)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(sim.state_path), uuid, str(n)]) for n in range(1, 7)]
    for p in procs:
        assert p.wait(timeout=HANG_S) == 0
    assert len({p.pid for p in sim.processes()}) == 60


def test_host_config_selects_the_simulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "host.yaml"
    sim_cfg = f"  sim:\n    state: {tmp_path}/g.json\n    instance_type: g7e.12xlarge\n"
    cfg.write_text("session: {other: layer}\ngpu:\n  backend: sim\n" + sim_cfg)
    monkeypatch.setenv("CALQUE_HOST_CONFIG", str(cfg))
    backend = open_backend()
    assert isinstance(backend, SimGpu)
    assert [g.card for g in backend.gpus()] == ["RTX-PRO-6000-Blackwell-Server-Edition"] * 2
    assert load_gpu_config().backend == "sim"
    cfg.write_text("gpu: {backend: sim}\n")
    with pytest.raises(Exception, match=r"gpu\.sim\.state"):
        load_gpu_config()


def _oracle_accepts(card_key: str, placed: list[tuple[str, int]]) -> bool:
    """An independent statement of the driver's rules, written out slice by slice."""
    card = load_catalog().cards[card_key]
    slices: list[int] = []
    for name, start in placed:
        p = card.profile(name)
        if start not in p.placements.starts:
            return False
        slices += range(start, start + p.placements.size)
    names = [n for n, _ in placed]
    return (
        len(slices) == len(set(slices))
        and all(names.count(p.name) <= p.max_count for p in card.profiles)
        and len(placed) <= card.max_instances
        and sum(card.profile(n).compute_slices for n in names) <= card.compute_slices
        and sum("+me" in n for n in names) <= 1
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), card_key=st.sampled_from(MIG_CARDS))
def test_simulator_never_accepts_an_invalid_instance_set(tmp_path: Path, data: st.DataObject, card_key: str) -> None:
    card = load_catalog().cards[card_key]
    sim = SimGpu.create(tmp_path / f"{card_key}.json", [card_key], mig=True)
    placed: list[tuple[str, int]] = []
    for _ in range(data.draw(st.integers(1, 9))):
        p = data.draw(st.sampled_from(card.profiles))
        start = data.draw(st.sampled_from([*p.placements.starts, card.placement_units - 1]))
        ok = _oracle_accepts(card_key, [*placed, (p.name, start)])
        try:
            sim.create_gpu_instance(0, p.profile_id, start)
            accepted = True
        except nv.GpuDriverError as exc:
            accepted = False
            assert exc.code in (nv.INVALID_ARGUMENT, nv.INSUFFICIENT_RESOURCES)
        assert accepted == ok, (card_key, placed, p.name, start)
        if accepted:
            placed.append((p.name, start))
    got = sorted((gi.profile, gi.placement_start) for gi in sim.gpu_instances(0))
    assert got == sorted(placed)


def test_hosts_created_concurrently_from_config_end_up_as_one(tmp_path: Path) -> None:
    cfg = tmp_path / "host.yaml"
    cfg.write_text(f"gpu: {{backend: sim, sim: {{state: {tmp_path}/race.json, cards: [L4-24GB]}}}}\n")
    code = (
        "import sys; from calque.gpu.hostconfig import load_gpu_config, open_backend\n"
        "b = open_backend(load_gpu_config(sys.argv[1]))\n"
        "b.add_process(b.gpus()[0].uuid, int(sys.argv[2]))\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(cfg), str(n)]) for n in range(1, 5)]
    for p in procs:
        assert p.wait(timeout=HANG_S) == 0
    assert sorted(p.pid for p in SimGpu(tmp_path / "race.json").processes()) == [1, 2, 3, 4]
