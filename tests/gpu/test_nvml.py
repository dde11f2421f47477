"""The NVML backend against a strict fake at the pynvml boundary: call sequences and error mapping."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import pynvml
import pytest
from calque.cli.main import run
from calque.gpu import nvml_errors as nv
from calque.gpu.catalog import load_catalog
from calque.gpu.nvml import NvmlBackend
from calque.gpu.verify import verify

from gpu.fake_libnvml import FakeLibNvml
from gpu.fake_pynvml import MUTATING, FakePynvml, card_from_catalog


def _fake(*keys: str, mig: bool = True) -> FakePynvml:
    return FakePynvml([card_from_catalog(k, i, mig=mig) for i, k in enumerate(keys)])


def test_reads_gpus_and_mig_devices_through_pynvml() -> None:
    fake = _fake("A100-40GB", "L4-24GB")
    b = NvmlBackend(fake)
    assert fake.calls == ["nvmlInit"]
    gi = b.create_gpu_instance(0, 9, 4)  # 3g.20gb at 4
    ci = b.create_compute_instance(0, gi.gi_id, 3)
    gpus = b.gpus()
    assert [(g.card, g.mig_current) for g in gpus] == [("A100-40GB", True), ("L4-24GB", False)]
    assert gpus[1].compute_mode == "DEFAULT"
    (dev,) = b.mig_devices()
    assert (dev.profile, dev.placement_start, dev.placement_size, dev.gi_id, dev.ci_id) == (
        "3g.20gb",
        4,
        4,
        gi.gi_id,
        ci,
    )
    assert dev.uuid.startswith("MIG-") and dev.sms == 42
    fake.cards[0].processes[dev.uuid] = [(1234, 512)]
    fake.cards[1].processes[gpus[1].uuid] = [(99, 100)]
    procs = {(p.pid, p.device_uuid, p.used_memory_mib) for p in b.processes()}
    assert procs == {(1234, dev.uuid, 512), (99, gpus[1].uuid, 100)}
    (inst,) = b.gpu_instances(0)
    assert inst.compute_instances[0].uuid == dev.uuid
    b.close()
    assert fake.calls[-1] == "nvmlShutdown"


def test_create_passes_the_placement_by_reference_and_destroys_in_order() -> None:
    fake = _fake("H100-80GB")
    b = NvmlBackend(fake)
    gi = b.create_gpu_instance(0, 19, 6)
    ci = b.create_compute_instance(0, gi.gi_id, 1)
    fake.calls.clear()
    b.destroy_compute_instance(0, gi.gi_id, ci)
    b.destroy_gpu_instance(0, gi.gi_id)
    assert [c for c in fake.calls if c in MUTATING] == ["nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy"]
    assert fake.cards[0].gis == {}


@pytest.mark.parametrize(
    ("code", "error", "advice"),
    [
        (pynvml.NVML_ERROR_NOT_SUPPORTED, nv.GpuNotSupported, "does not support"),
        (pynvml.NVML_ERROR_NO_PERMISSION, nv.GpuNoPermission, "run as root"),
        (pynvml.NVML_ERROR_IN_USE, nv.GpuInUse, "stop the processes"),
        (pynvml.NVML_ERROR_RESET_REQUIRED, nv.GpuResetRequired, "reset the GPU"),
        (pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, nv.GpuInsufficientResources, "does not fit"),
    ],
)
def test_nvml_error_codes_become_clear_calque_errors(code: int, error: type, advice: str) -> None:
    fake = _fake("A100-40GB")
    fake.fail["nvmlDeviceSetMigMode"] = code
    with pytest.raises(error) as exc:
        NvmlBackend(fake).set_mig_mode(0, False)
    assert exc.value.code == code and exc.value.exit_code == 3
    assert advice in str(exc.value) and "GPU 0" in str(exc.value)


def test_real_conflicts_from_the_driver_surface_with_their_codes() -> None:
    fake = _fake("A100-40GB")
    b = NvmlBackend(fake)
    b.create_gpu_instance(0, 9, 0)
    with pytest.raises(nv.GpuInsufficientResources):
        b.create_gpu_instance(0, 14, 2)
    with pytest.raises(nv.GpuInUse):
        b.set_mig_mode(0, False)


def test_verify_is_read_only_and_clean_on_a_catalog_card() -> None:
    fake = _fake("A100-40GB", "L40S-48GB")
    report = verify(NvmlBackend(fake))
    assert report.differences == []
    assert report.gpus[0].profiles_checked == 7
    assert not set(fake.calls) & MUTATING


def test_verify_prints_every_difference() -> None:
    card = card_from_catalog("H200-141GB")
    card.profiles[0]["starts"] = [0, 1, 2, 3, 4, 5]
    card.profiles[0]["sms"] = 18
    card.profiles = [p for p in card.profiles if p["name"] != "MIG 1g.35gb"]
    fake = FakePynvml([card])
    diffs = {(d.profile, d.field): d for d in verify(NvmlBackend(fake)).differences}
    assert diffs[("1g.18gb", "placements")].uncertain is True
    assert diffs[("1g.18gb", "sms")].driver == 18
    assert diffs[("1g.35gb", "present")].driver is False


def test_verify_notes_a_card_with_mig_off_instead_of_changing_it() -> None:
    fake = _fake("H100-80GB", mig=False)
    report = verify(NvmlBackend(fake))
    assert "MIG mode is off" in report.gpus[0].notes[0]
    assert not set(fake.calls) & MUTATING


def test_cli_verify_json_and_human(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    card = card_from_catalog("A100-40GB")
    card.profiles[-1]["count"] = 2
    monkeypatch.setitem(sys.modules, "pynvml", FakePynvml([card]))
    assert run(["gpu", "verify", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["differences"][0]["field"] == "max_count"
    assert run(["gpu", "verify", "--strict"]) == 1
    out = capsys.readouterr().out
    assert "7g.40gb" in out and "1 difference(s)" in out


def test_cli_verify_without_a_driver_fails_clearly_with_exit_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = _fake("A100-40GB")
    fake.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert run(["gpu", "verify"]) == 3
    assert "install the NVIDIA driver" in capsys.readouterr().err


def test_cli_verify_with_the_real_pynvml_on_a_machine_without_a_driver(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - a machine with a driver
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    assert run(["gpu", "verify"]) == 3
    assert "NVML_ERROR_" in capsys.readouterr().err


def test_verify_recognises_a_renamed_card_by_pci_id_and_reports_the_name() -> None:
    card = card_from_catalog("H200-141GB")
    card.name = "NVIDIA H200 141GB HBM3e"
    report = verify(NvmlBackend(FakePynvml([card])))
    assert report.gpus[0].card == "H200-141GB"
    assert [(d.field, d.driver) for d in report.differences] == [("nvml_name", "NVIDIA H200 141GB HBM3e")]


def test_create_with_placement_call_sequence() -> None:
    fake = _fake("A100-40GB")
    b = NvmlBackend(fake)
    b.driver_profiles(0)  # the profile table is read once and cached
    fake.calls.clear()
    gi = b.create_gpu_instance(0, 14, 2)  # 2g.10gb at 2
    b.create_compute_instance(0, gi.gi_id, 2)
    assert fake.calls == [
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlGpuInstanceGetInfo",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetGpuInstanceById",
        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlComputeInstanceGetInfo",
    ]
    assert (gi.placement_start, gi.placement_size) == (2, 2)


def test_verify_call_sequence_reads_each_profile_and_its_placements_once() -> None:
    fake = _fake("RTX-PRO-6000-Blackwell-Server-Edition")
    verify(NvmlBackend(fake))
    n = len(load_catalog().cards["RTX-PRO-6000-Blackwell-Server-Edition"].profiles)
    assert fake.calls.count("nvmlDeviceGetGpuInstancePossiblePlacements") == n
    assert fake.calls.count("nvmlDeviceGetGpuInstanceProfileInfo") == pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
    assert fake.calls[0] == "nvmlInit"


@pytest.fixture
def libnvml(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeLibNvml]:
    """Install a fake libnvidia-ml under the real pynvml wrappers."""

    def install(card: str, **kw: Any) -> FakeLibNvml:
        lib = FakeLibNvml(card, **kw)
        monkeypatch.setattr(pynvml, "nvmlLib", lib)
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        return lib

    return install


def test_verify_through_the_real_pynvml_ctypes_layer(
    libnvml: Callable[..., FakeLibNvml], capsys: pytest.CaptureFixture[str]
) -> None:
    lib = libnvml("H200-141GB", count=2)
    lib.overrides[("1g.18gb", "starts")] = [0, 1, 2, 3, 4, 5]
    lib.overrides[("3g.71gb", "profile_id")] = 10
    assert run(["gpu", "verify", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["driver_version"] == "595.91.07"
    assert [g["card"] for g in report["gpus"]] == ["H200-141GB", "H200-141GB"]
    assert [g["notes"] for g in report["gpus"]] == [[], []] and report["gpus"][0]["profiles_checked"] == 7
    assert "1g.35gb.profile_id" in report["gpus"][0]["confirmed"]  # uncertain in the catalog, seen on the card
    assert "3g.71gb.profile_id" not in report["gpus"][0]["confirmed"]
    assert "card.memory_mib" in report["gpus"][0]["confirmed"]
    got = {(d["gpu_index"], d["profile"], d["field"]) for d in report["differences"]}
    assert got == {(i, p, f) for i in (0, 1) for p, f in [("1g.18gb", "placements"), ("3g.71gb", "profile_id")]}
    assert not any(n.startswith(("nvmlDeviceSet", "nvmlDeviceCreate", "nvmlGpuInstanceDestroy")) for n in lib.looked_up)


def test_verify_through_pynvml_on_a_mig_less_card_and_with_mig_off(
    libnvml: Callable[..., FakeLibNvml], capsys: pytest.CaptureFixture[str]
) -> None:
    libnvml("L40S-48GB")
    assert run(["gpu", "verify"]) == 0
    out = capsys.readouterr().out
    assert "no MIG" in out and "the catalog matches every card" in out
    libnvml("A100-40GB", mig=False)
    assert run(["gpu", "verify"]) == 0
    assert "MIG mode is off" in capsys.readouterr().out


def test_verify_falls_back_to_v1_profile_info_on_an_older_driver(
    libnvml: Callable[..., FakeLibNvml], capsys: pytest.CaptureFixture[str]
) -> None:
    lib = libnvml("A100-40GB")
    lib.old_driver = True
    assert run(["gpu", "verify", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["differences"] == [] and report["gpus"][0]["profiles_checked"] == 7
    assert "nvmlDeviceGetGpuInstanceProfileInfo" in lib.looked_up


def test_verify_compares_profiles_with_mig_off_when_the_driver_answers(
    libnvml: Callable[..., FakeLibNvml], capsys: pytest.CaptureFixture[str]
) -> None:
    lib = libnvml("H100-80GB", mig=False)
    lib.profiles_when_mig_off = True
    lib.overrides[("7g.80gb", "max_count")] = 2
    assert run(["gpu", "verify", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpus"][0]["profiles_checked"] == 7 and "listed its profiles anyway" in report["gpus"][0]["notes"][0]
    assert [(d["profile"], d["field"], d["uncertain"]) for d in report["differences"]] == [
        ("7g.80gb", "max_count", False)
    ]
