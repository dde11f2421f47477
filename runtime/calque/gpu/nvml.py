"""The NVML backend: every ``pynvml`` call of calque goes through ``NvmlBackend``.

It is built in three layers, one job each: the adapter that loads ``pynvml`` and maps its errors
(``nvml_calls.py``), the reads (``nvml_reads.py``, with utilisation from ``nvml_sampling.py``), and
here the control calls that change a GPU. A GPU reset has no NVML call; it runs
``nvidia-smi --gpu-reset`` (``calque.gpu.smi_reset``).
"""

from __future__ import annotations

import ctypes
from typing import Any

from calque.gpu import nvml_errors as nv
from calque.gpu.backend import COMPUTE_MODES
from calque.gpu.catalog import COMPUTE_INSTANCE_PROFILES
from calque.gpu.nvml_reads import NvmlReads
from calque.gpu.nvml_types import DriverProfile
from calque.gpu.smi_reset import nvidia_smi_reset
from calque.models import GpuInstance

__all__ = ["DriverProfile", "NvmlBackend"]


class NvmlBackend(NvmlReads):
    """``GpuBackend`` over NVML on a host with an NVIDIA driver: the reads, and the changes."""

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        mode = self.const("NVML_DEVICE_MIG_", "ENABLE" if enabled else "DISABLE")
        self.call(f"set GPU {index}'s MIG mode", self._nv.nvmlDeviceSetMigMode, self.handle(index), mode)
        self._profiles.pop(index, None)

    def reset_gpu(self, index: int) -> None:
        nvidia_smi_reset(index)
        self._profiles.pop(index, None)

    def create_gpu_instance(self, index: int, profile_id: int, start: int) -> GpuInstance:
        h = self.handle(index)
        p = self.driver_profiles(index).get(profile_id)
        if p is None:
            raise nv.driver_error(nv.INVALID_ARGUMENT, f"GPU {index} offers no GPU-instance profile id {profile_id}")
        placement = self._nv.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, p.size
        gi = self.call(
            f"create a {p.name} instance at {start} on GPU {index}",
            self._nv.nvmlDeviceCreateGpuInstanceWithPlacement,
            h,
            profile_id,
            ctypes.byref(placement),
        )
        info = self.call("read the new GPU instance", self._nv.nvmlGpuInstanceGetInfo, gi)
        return GpuInstance(
            gpu_index=index,
            gi_id=int(info.id),
            profile=p.name,
            profile_id=profile_id,
            placement_start=int(info.placement.start),
            placement_size=max(1, int(info.placement.size)),
        )

    def _gi(self, index: int, gi_id: int) -> Any:
        return self.call(
            f"look up GPU {index}'s GPU instance {gi_id}",
            self._nv.nvmlDeviceGetGpuInstanceById,
            self.handle(index),
            gi_id,
        )

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        self.call(
            f"destroy GPU {index}'s GPU instance {gi_id}", self._nv.nvmlGpuInstanceDestroy, self._gi(index, gi_id)
        )

    def create_compute_instance(self, index: int, gi_id: int, compute_slices: int) -> int:
        suffix = COMPUTE_INSTANCE_PROFILES.get(compute_slices)
        if suffix is None:
            raise nv.driver_error(nv.INVALID_ARGUMENT, f"no {compute_slices}-slice compute-instance profile")
        gi = self._gi(index, gi_id)
        info = self.call(
            f"read the {compute_slices}-slice compute-instance profile",
            self._nv.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            gi,
            self.const("NVML_COMPUTE_INSTANCE_PROFILE_", suffix),
            self.const("NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_", "SHARED"),
        )
        ci = self.call(
            f"create a compute instance in GPU {index}'s GPU instance {gi_id}",
            self._nv.nvmlGpuInstanceCreateComputeInstance,
            gi,
            int(info.id),
        )
        return int(self.call("read the new compute instance", self._nv.nvmlComputeInstanceGetInfo, ci).id)

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        gi = self._gi(index, gi_id)
        ci = self.call(
            f"look up compute instance {ci_id} of GPU instance {gi_id}",
            self._nv.nvmlGpuInstanceGetComputeInstanceById,
            gi,
            ci_id,
        )
        self.call(f"destroy compute instance {ci_id} of GPU instance {gi_id}", self._nv.nvmlComputeInstanceDestroy, ci)

    def set_compute_mode(self, index: int, mode: str) -> None:
        if mode not in COMPUTE_MODES:
            raise nv.driver_error(nv.INVALID_ARGUMENT, f"compute mode {mode!r}; valid: {', '.join(COMPUTE_MODES)}")
        self.call(
            f"set GPU {index}'s compute mode to {mode}",
            self._nv.nvmlDeviceSetComputeMode,
            self.handle(index),
            self.const("NVML_COMPUTEMODE_", mode),
        )
