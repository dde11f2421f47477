"""Discovery through NVML: GPUs, the driver's MIG profiles, GPU and compute instances, MIG devices,
processes and (through ``nvml_sampling.py``) utilisation. Only reads: the control calls that change a
GPU are ``nvml.py``'s, which builds on these.
"""

from __future__ import annotations

import ctypes
from typing import Any

from calque.gpu import nvml_errors as nv
from calque.gpu.caps import mig_capability_devices
from calque.gpu.catalog import COMPUTE_INSTANCE_PROFILES, load_catalog
from calque.gpu.nvml_calls import NvmlCalls
from calque.gpu.nvml_sampling import NvmlSampler
from calque.gpu.nvml_types import DriverProfile, text_of
from calque.models import ComputeInstance, DeviceSample, GpuDevice, GpuInstance, GpuProcess, MigDevice

_MAX_GI_ID = 15  # the driver's GPU-instance ids are 0..14
_MAX_CI_ID = 8
_COMPUTE_MODE_NAMES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}


class NvmlReads(NvmlCalls):
    """The reads of ``GpuBackend`` over NVML, with the driver's profile table cached per GPU."""

    def __init__(self, lib: Any | None = None) -> None:
        super().__init__(lib)
        self._profiles: dict[int, dict[int, DriverProfile]] = {}
        self._sampler: NvmlSampler | None = None

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
        super().close()

    def driver_version(self) -> str:
        return text_of(self.call("read the driver version", self._nv.nvmlSystemGetDriverVersion))

    def pci_device_id(self, index: int) -> str | None:
        """The PCI device id as the catalog writes it (e.g. ``0x233510DE``), or None when unreadable."""
        info = self.maybe(
            f"read GPU {index}'s PCI info",
            self._nv.nvmlDeviceGetPciInfo,
            self.handle(index),
            absent=(nv.NOT_SUPPORTED,),
        )
        return None if info is None else f"0x{int(info.pciDeviceId):08X}"

    def mig_mode_raw(self, index: int) -> tuple[bool, bool]:
        """(current, pending); raises GpuNotSupported on a card without MIG."""
        got = self.call(f"read GPU {index}'s MIG mode", self._nv.nvmlDeviceGetMigMode, self.handle(index))
        return bool(got[0]), bool(got[1])

    def gpus(self) -> list[GpuDevice]:
        cat = load_catalog()
        out = []
        for i in range(self.count()):
            h = self.handle(i)
            name = text_of(self.call(f"read GPU {i}'s name", self._nv.nvmlDeviceGetName, h))
            current, pending = self.mig_mode(i)
            no = (nv.NOT_SUPPORTED,)
            pm = self.maybe(f"read GPU {i}'s persistence mode", self._nv.nvmlDeviceGetPersistenceMode, h, absent=no)
            cm = self.maybe(f"read GPU {i}'s compute mode", self._nv.nvmlDeviceGetComputeMode, h, absent=no)
            card = cat.find_card(name)
            out.append(
                GpuDevice(
                    index=i,
                    name=name,
                    uuid=text_of(self.call(f"read GPU {i}'s UUID", self._nv.nvmlDeviceGetUUID, h)),
                    minor=self._minor(i, h),
                    memory_mib=int(self.call(f"read GPU {i}'s memory", self._nv.nvmlDeviceGetMemoryInfo, h).total)
                    >> 20,
                    card=card.key if card else None,
                    mig_current=current,
                    mig_pending=pending,
                    persistence_mode=bool(pm),
                    compute_mode=_COMPUTE_MODE_NAMES.get(int(cm or 0), str(cm)),
                )
            )
        return out

    def _minor(self, index: int, h: Any) -> int:
        """/dev/nvidia<minor>; some virtualised GPUs do not report it, and there it equals the index."""
        got = self.maybe(
            f"read GPU {index}'s minor number", self._nv.nvmlDeviceGetMinorNumber, h, absent=(nv.NOT_SUPPORTED,)
        )
        return index if got is None else int(got)

    def _profile_info(self, index: int, h: Any, const: int, name: str) -> Any:
        """GetGpuInstanceProfileInfo, v2 (with the name) or, on a driver without it, v1."""
        what = f"read GPU {index}'s MIG profile {name}"
        absent = (nv.NOT_SUPPORTED, nv.INVALID_ARGUMENT, nv.NOT_FOUND)
        try:
            return self.maybe(what, self._nv.nvmlDeviceGetGpuInstanceProfileInfo, h, const, absent=absent)
        except nv.GpuDriverError as exc:
            if exc.code not in (nv.ARGUMENT_VERSION_MISMATCH, nv.FUNCTION_NOT_FOUND):
                raise
        return self.maybe(what, self._nv.nvmlDeviceGetGpuInstanceProfileInfo, h, const, 1, absent=absent)

    def driver_profiles(self, index: int) -> dict[int, DriverProfile]:
        """The GPU-instance profiles the driver offers on one GPU (needs MIG mode on), by profile id."""
        if index in self._profiles:
            return self._profiles[index]
        h = self.handle(index)
        names = {
            int(getattr(self._nv, a)): a.removeprefix("NVML_GPU_INSTANCE_PROFILE_")
            for a in dir(self._nv)
            if a.startswith("NVML_GPU_INSTANCE_PROFILE_") and not a.endswith("_COUNT")
        }
        table: dict[int, DriverProfile] = {}
        for const in sorted(names):
            info = self._profile_info(index, h, const, names[const])
            if info is None:
                continue
            p = DriverProfile(
                profile_id=int(info.id),
                constant=names[const],
                name=text_of(getattr(info, "name", b"")).removeprefix("MIG "),
                compute_slices=int(info.sliceCount),
                max_count=int(info.instanceCount),
                sms=int(info.multiprocessorCount),
                memory_mib=int(info.memorySizeMB),
            )
            placements = (self._nv.c_nvmlGpuInstancePlacement_t * 16)()
            count = ctypes.c_uint(16)
            self.call(
                f"read GPU {index}'s placements for profile {p.profile_id}",
                self._nv.nvmlDeviceGetGpuInstancePossiblePlacements,
                h,
                p.profile_id,
                placements,
                ctypes.byref(count),
            )
            p.starts = [int(placements[i].start) for i in range(count.value)]
            p.size = int(placements[0].size) if count.value else 0
            table[p.profile_id] = p
        self._profiles[index] = table
        return table

    def _gi_handles(self, index: int, h: Any) -> list[tuple[Any, Any]]:
        out = []
        for gi_id in range(_MAX_GI_ID):
            gi = self.maybe(
                f"look up GPU {index}'s GPU instance {gi_id}",
                self._nv.nvmlDeviceGetGpuInstanceById,
                h,
                gi_id,
                absent=(nv.NOT_FOUND, nv.INVALID_ARGUMENT),
            )
            if gi is not None:
                out.append((gi, self.call(f"read GPU instance {gi_id}", self._nv.nvmlGpuInstanceGetInfo, gi)))
        return out

    def _ci_infos(self, gi: Any) -> list[Any]:
        out = []
        for ci_id in range(_MAX_CI_ID):
            ci = self.maybe(
                f"look up compute instance {ci_id}",
                self._nv.nvmlGpuInstanceGetComputeInstanceById,
                gi,
                ci_id,
                absent=(nv.NOT_FOUND, nv.INVALID_ARGUMENT),
            )
            if ci is not None:
                out.append(self.call(f"read compute instance {ci_id}", self._nv.nvmlComputeInstanceGetInfo, ci))
        return out

    def _ci_slices(self, gi: Any, ci_profile_id: int) -> int:
        """Compute slices of a CI profile id (by asking the driver for each CI profile's id)."""
        for n, suffix in COMPUTE_INSTANCE_PROFILES.items():
            info = self.maybe(
                "read a compute-instance profile",
                self._nv.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gi,
                self.const("NVML_COMPUTE_INSTANCE_PROFILE_", suffix),
                self.const("NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_", "SHARED"),
                absent=(nv.NOT_SUPPORTED, nv.INVALID_ARGUMENT),
            )
            if info is not None and int(info.id) == ci_profile_id:
                return int(info.sliceCount) or n
        return 0

    def gpu_instances(self, index: int) -> list[GpuInstance]:
        h = self.handle(index)
        profiles = self.driver_profiles(index)
        mig_uuids = {(d.gi_id, d.ci_id): d.uuid for d in self._mig_devices_of(index, h)}
        out = []
        for gi, info in self._gi_handles(index, h):
            p = profiles.get(int(info.profileId))
            gi_slices = p.compute_slices if p else 0
            cis = []
            for ci in self._ci_infos(gi):
                n = self._ci_slices(gi, int(ci.profileId))
                name = p.name if p else str(info.profileId)
                cis.append(
                    ComputeInstance(
                        ci_id=int(ci.id),
                        compute_slices=max(n, 1),
                        profile=f"{n}c.{name}" if 0 < n < gi_slices else None,
                        uuid=mig_uuids.get((int(info.id), int(ci.id))),
                    )
                )
            out.append(
                GpuInstance(
                    gpu_index=index,
                    gi_id=int(info.id),
                    profile=p.name if p else f"profile {info.profileId}",
                    profile_id=int(info.profileId),
                    placement_start=int(info.placement.start),
                    placement_size=max(1, int(info.placement.size)),
                    compute_instances=cis,
                )
            )
        return sorted(out, key=lambda g: g.placement_start)

    def _mig_devices_of(self, index: int, h: Any) -> list[MigDevice]:
        profiles = self.driver_profiles(index)
        gis = {int(info.id): info for _, info in self._gi_handles(index, h)}
        uuid = text_of(self.call(f"read GPU {index}'s UUID", self._nv.nvmlDeviceGetUUID, h))
        minor = self._minor(index, h)
        out = []
        for m in self.mig_handles(index, h):
            gi_id = int(self.call("read a MIG device's GPU instance", self._nv.nvmlDeviceGetGpuInstanceId, m))
            ci_id = int(self.call("read a MIG device's compute instance", self._nv.nvmlDeviceGetComputeInstanceId, m))
            info = gis.get(gi_id)
            p = profiles.get(int(info.profileId)) if info is not None else None
            attrs = self.maybe(
                "read a MIG device's attributes", self._nv.nvmlDeviceGetAttributes, m, absent=(nv.NOT_SUPPORTED,)
            )
            out.append(
                MigDevice(
                    gpu_index=index,
                    gpu_uuid=uuid,
                    gpu_minor=minor,
                    profile=p.name if p else "unknown",
                    profile_id=int(info.profileId) if info is not None else 0,
                    placement_start=int(info.placement.start) if info is not None else 0,
                    placement_size=max(1, int(info.placement.size)) if info is not None else 1,
                    gi_id=gi_id,
                    ci_id=ci_id,
                    uuid=text_of(self.call("read a MIG device's UUID", self._nv.nvmlDeviceGetUUID, m)),
                    memory_mib=int(self.call("read a MIG device's memory", self._nv.nvmlDeviceGetMemoryInfo, m).total)
                    >> 20,
                    sms=int(attrs.multiprocessorCount) if attrs is not None else None,
                )
            )
        return sorted(out, key=lambda d: (d.placement_start, d.ci_id))

    def mig_devices(self) -> list[MigDevice]:
        out: list[MigDevice] = []
        for i in range(self.count()):
            if self.mig_mode(i)[0]:
                out += self._mig_devices_of(i, self.handle(i))
        return out

    def _procs(self, what: str, h: Any, device_uuid: str) -> list[GpuProcess]:
        got = self.call(f"list {what}'s processes", self._nv.nvmlDeviceGetComputeRunningProcesses, h)
        return [
            GpuProcess(pid=int(p.pid), used_memory_mib=int(p.usedGpuMemory or 0) >> 20, device_uuid=device_uuid)
            for p in got
        ]

    def processes(self) -> list[GpuProcess]:
        out: list[GpuProcess] = []
        for i in range(self.count()):
            h = self.handle(i)
            if self.mig_mode(i)[0]:
                for m in self.mig_handles(i, h):
                    out += self._procs(
                        f"GPU {i}'s MIG device", m, text_of(self.call("read UUID", self._nv.nvmlDeviceGetUUID, m))
                    )
            else:
                out += self._procs(f"GPU {i}", h, text_of(self.call("read UUID", self._nv.nvmlDeviceGetUUID, h)))
        return out

    def utilisation(self) -> list[DeviceSample]:
        if self._sampler is None:  # keeps GPM samples between calls: see calque.gpu.nvml_sampling
            self._sampler = NvmlSampler(self)
        return self._sampler.take()

    def capability_devices(self, mig: MigDevice) -> list[str]:
        return [str(p) for p in mig_capability_devices(mig, "/")]
