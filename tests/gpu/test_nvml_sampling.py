"""Utilisation through the NVML backend, against the strict pynvml fake shaped as nvidia-ml-py's bindings."""

from __future__ import annotations

import inspect

import pynvml
import pytest
from calque.gpu import nvml_sampling as nvml_util
from calque.gpu.nvml import NvmlBackend

from gpu.fake_libnvml import FakeLibNvml
from gpu.fake_pynvml import MUTATING, FakePynvml, card_from_catalog


@pytest.fixture(autouse=True)
def _no_first_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_util, "FIRST_INTERVAL_S", 0.0)


def test_every_call_the_fake_answers_is_one_the_real_bindings_have_with_as_many_arguments() -> None:
    for name, fn in inspect.getmembers(FakePynvml, inspect.isfunction):
        if not name.startswith("nvml"):
            continue
        real = getattr(pynvml, name, None)
        assert real is not None, f"nvidia-ml-py has no {name}"
        params = inspect.signature(real).parameters.values()
        required = [p for p in params if p.default is inspect.Parameter.empty]
        got = [p for p in inspect.signature(fn).parameters if p != "self"]
        assert len(required) <= len(got) <= len(params), (name, got, list(params))


def test_a_call_the_real_bindings_lack_fails_on_the_fake() -> None:
    fake = FakePynvml([card_from_catalog("H100-80GB")])
    with pytest.raises(AttributeError):
        fake.nvmlGpmMigSampleGetV2  # noqa: B018 - no such binding


def test_gpm_per_gpu_instance_on_hopper_two_samples_apart_and_no_change_to_the_gpu() -> None:
    card = card_from_catalog("H100-80GB")
    card.gpm = True
    fake = FakePynvml([card])
    b = NvmlBackend(fake)
    gi_a = b.create_gpu_instance(0, 19, 0)  # 1g.10gb at 0
    b.create_compute_instance(0, gi_a.gi_id, 1)
    gi_b = b.create_gpu_instance(0, 19, 1)
    b.create_compute_instance(0, gi_b.gi_id, 1)
    migs = b.mig_devices()
    busy = next(m for m in migs if m.gi_id == gi_a.gi_id)
    card.util = {"gpu": 40.0, f"gi{gi_a.gi_id}": 87.5, f"gi{gi_b.gi_id}": 0.0}
    card.used_mib[busy.uuid] = 2048
    fake.calls.clear()
    first = {s.device_uuid: s for s in b.utilisation()}
    assert not MUTATING & set(fake.calls) and "nvmlGpmSetStreamingEnabled" not in fake.calls
    assert fake.calls.count("nvmlGpmMigSampleGet") == 4  # two samples of each GPU instance
    assert first[busy.uuid].kind == "mig" and first[busy.uuid].source == "gpm"
    assert first[busy.uuid].sm_percent == 87.5 and first[busy.uuid].active_percent == 87.5
    assert first[busy.uuid].memory_used_mib == 2048
    idle = next(m for m in migs if m.gi_id == gi_b.gi_id)
    assert first[idle.uuid].active_percent == 0.0
    assert first[card.uuid].kind == "gpu" and first[card.uuid].graphics_percent == 40.0
    # The next call measures from the kept sample: one new sample per GPU instance, no wait.
    card.util[f"gi{gi_a.gi_id}"] = 3.0
    fake.calls.clear()
    second = {s.device_uuid: s for s in b.utilisation()}
    assert fake.calls.count("nvmlGpmMigSampleGet") == 2
    assert second[busy.uuid].active_percent == 3.0
    kept = len(fake.samples)
    assert kept == 3  # the whole GPU and two GPU instances
    b.close()
    assert fake.samples == {}  # every sample freed at close


def test_a100_mig_has_no_gpm_so_its_slices_are_unknown() -> None:
    fake = FakePynvml([card_from_catalog("A100-40GB")])
    b = NvmlBackend(fake)
    gi = b.create_gpu_instance(0, 9, 4)
    b.create_compute_instance(0, gi.gi_id, 3)
    (dev,) = b.mig_devices()
    samples = {s.device_uuid: s for s in b.utilisation()}
    assert samples[dev.uuid].active_percent is None and samples[dev.uuid].source == "none"
    assert "nvmlGpmMigSampleGet" not in fake.calls
    # nvmlDeviceGetUtilizationRates is not offered in MIG mode: the whole GPU is unknown too.
    assert samples[fake.cards[0].uuid].active_percent is None


def test_a_whole_gpu_without_gpm_reads_utilisation_rates_and_each_mps_client_its_own_use() -> None:
    card = card_from_catalog("L4-24GB", mig=False)
    card.util = {"gpu": 61.0}
    card.processes[card.uuid] = [(4242, 300), (4343, 100)]
    card.process_util = {4242: 55}  # the driver reports no sample for 4343 (an MPS client it does not sample)
    fake = FakePynvml([card])
    b = NvmlBackend(fake)
    samples = b.utilisation()
    gpu = next(s for s in samples if s.kind == "gpu")
    assert (gpu.source, gpu.graphics_percent, gpu.sm_percent) == ("utilization-rates", 61.0, None)
    procs = {s.pid: s for s in samples if s.kind == "process"}
    assert procs[4242].sm_percent == 55.0 and procs[4242].memory_used_mib == 300
    # No sample for it: unknown (counted active by idle reclaim), never 0 %.
    assert procs[4343].sm_percent is None and procs[4343].source == "none" and procs[4343].device_uuid == card.uuid
    card.process_util = {}  # no sample of anyone since the last read (NOT_FOUND): unknown, never zero
    procs = {s.pid: s for s in b.utilisation() if s.kind == "process"}
    assert [procs[p].active_percent for p in (4242, 4343)] == [None, None]
    card.process_util = None  # a driver without per-process use: unknown, never zero
    procs = {s.pid: s for s in b.utilisation() if s.kind == "process"}
    assert procs[4242].active_percent is None and procs[4242].source == "none"


def test_gpm_refused_on_a_gpu_falls_back_and_never_raises() -> None:
    card = card_from_catalog("H100-80GB", mig=False)
    card.gpm = True
    card.util = {"gpu": 12.0}
    fake = FakePynvml([card])
    fake.fail["nvmlGpmSampleGet"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    b = NvmlBackend(fake)
    (gpu,) = [s for s in b.utilisation() if s.kind == "gpu"]
    assert (gpu.source, gpu.graphics_percent) == ("utilization-rates", 12.0)
    assert len(fake.samples) == 0  # a refused sample was freed


@pytest.mark.parametrize("gpm", [True, False])
def test_a_whole_h200_through_the_real_pynvml_ctypes_layer(monkeypatch: pytest.MonkeyPatch, gpm: bool) -> None:
    lib = FakeLibNvml("H200-141GB", mig=False)
    lib.gpm, lib.util = gpm, 42.0
    monkeypatch.setattr(pynvml, "nvmlLib", lib)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    with NvmlBackend() as b:
        (gpu,) = b.utilisation()
        assert gpu.kind == "gpu" and gpu.memory_used_mib == 0
        if gpm:
            assert (gpu.source, gpu.sm_percent, gpu.graphics_percent) == ("gpm", 42.0, 42.0)
            assert len(lib.gpm_samples) == 1  # the newer sample is kept for the next call
            lib.util = 7.5
            assert b.utilisation()[0].sm_percent == 7.5
        else:
            assert (gpu.source, gpu.sm_percent, gpu.graphics_percent) == ("utilization-rates", None, 42.0)
    assert lib.gpm_samples == {}
    assert not any(n.startswith(("nvmlDeviceSet", "nvmlGpmSetStreaming")) for n in lib.looked_up)


def test_a_failing_sample_free_never_keeps_nvml_from_shutting_down() -> None:
    card = card_from_catalog("H100-80GB", mig=False)
    card.gpm = True
    fake = FakePynvml([card])
    b = NvmlBackend(fake)
    b.utilisation()
    fake.fail["nvmlGpmSampleFree"] = pynvml.NVML_ERROR_UNKNOWN
    b.close()
    assert fake.calls[-1] == "nvmlShutdown" and not fake.initialised
