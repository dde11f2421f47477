"""The NVML backend: every ``pynvml`` call of calque goes through ``NvmlBackend``.

``pynvml`` (nvidia-ml-py) is imported when the backend is opened, so tests put a strict fake module
in its place and the same code runs. NVML errors become ``calque.gpu.errors`` errors with their code.
A GPU reset has no NVML call; it runs ``nvidia-smi --gpu-reset`` (``calque.gpu.smi_reset``).
"""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Callable
from typing import Any, TypeVar

from calque.gpu import errors as nv
from calque.gpu.backend import COMPUTE_MODES
from calque.gpu.caps import mig_capability_devices
from calque.gpu.catalog import COMPUTE_INSTANCE_PROFILES, load_catalog
from calque.gpu.nvml_sampling import NvmlSampler
from calque.gpu.nvml_types import DriverProfile, text_of
from calque.gpu.smi_reset import nvidia_smi_reset
from calque.models import ComputeInstance, DeviceSample, GpuDevice, GpuInstance, GpuProcess, MigDevice

__all__ = ["DriverProfile", "NvmlBackend"]

T = TypeVar("T")
_MAX_GI_ID = 15  # the driver's GPU-instance ids are 0..14
_MAX_CI_ID = 8
_COMPUTE_MODE_NAMES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}


class NvmlBackend:
    """``GpuBackend`` over NVML on a host with an NVIDIA driver."""

    def __init__(self, lib: Any | None = None) -> None:
        try:
            self._nv = lib if lib is not None else importlib.import_module("pynvml")
        except ImportError as exc:
            raise nv.NoGpuDriver(nv.LIBRARY_NOT_FOUND, "the nvidia-ml-py package (pynvml) is not installed") from exc
        self._call("initialise (is the NVIDIA driver installed and loaded?)", self._nv.nvmlInit)
        self._profiles: dict[int, dict[int, DriverProfile]] = {}
        self._sampler: NvmlSampler | None = None

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
        self._call("shut NVML down", self._nv.nvmlShutdown)

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the adapter: one place where pynvml errors become calque errors -----------------------

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            code = int(getattr(exc, "value", nv.UNKNOWN))
            try:
                text = str(exc)
            except Exception:  # pynvml's __str__ asks the library, which may be what failed
                text = nv.CODE_NAMES.get(code, f"NVML error {code}")
            raise nv.driver_error(code, f"NVML: could not {what}: {text}") from exc

    def _maybe(self, what: str, fn: Callable[..., T], *args: Any, absent: tuple[int, ...]) -> T | None:
        """A call whose listed error codes mean 'not there' rather than failure."""
        try:
            return self._call(what, fn, *args)
        except nv.GpuDriverError as exc:
            if exc.code in absent:
                return None
            raise

    def _handle(self, index: int) -> Any:
        return self._call(f"open GPU {index}", self._nv.nvmlDeviceGetHandleByIndex, index)

    @property
    def lib(self) -> Any:
        """The pynvml module (or the tests' fake) the sampler calls through this adapter."""
        return self._nv

    def _const(self, prefix: str, suffix: str) -> int:
        return int(getattr(self._nv, prefix + suffix))

    # -- reads --------------------------------------------------------------------------------

    def driver_version(self) -> str:
        return text_of(self._call("read the driver version", self._nv.nvmlSystemGetDriverVersion))

    def count(self) -> int:
        return int(self._call("count GPUs", self._nv.nvmlDeviceGetCount))

    def pci_device_id(self, index: int) -> str | None:
        """The PCI device id as the catalog writes it (e.g. ``0x233510DE``), or None when unreadable."""
        info = self._maybe(
            f"read GPU {index}'s PCI info",
            self._nv.nvmlDeviceGetPciInfo,
            self._handle(index),
            absent=(nv.NOT_SUPPORTED,),
        )
        return None if info is None else f"0x{int(info.pciDeviceId):08X}"

    def mig_mode_raw(self, index: int) -> tuple[bool, bool]:
        """(current, pending); raises GpuNotSupported on a card without MIG."""
        got = self._call(f"read GPU {index}'s MIG mode", self._nv.nvmlDeviceGetMigMode, self._handle(index))
        return bool(got[0]), bool(got[1])

    def mig_mode(self, index: int) -> tuple[bool, bool]:
        """(current, pending); (False, False) on a card without MIG."""
        h = self._handle(index)
        got = self._maybe(f"read GPU {index}'s MIG mode", self._nv.nvmlDeviceGetMigMode, h, absent=(nv.NOT_SUPPORTED,))
        return (False, False) if got is None else (bool(got[0]), bool(got[1]))

    def gpus(self) -> list[GpuDevice]:
        cat = load_catalog()
        out = []
        for i in range(self.count()):
            h = self._handle(i)
            name = text_of(self._call(f"read GPU {i}'s name", self._nv.nvmlDeviceGetName, h))
            current, pending = self.mig_mode(i)
            no = (nv.NOT_SUPPORTED,)
            pm = self._maybe(f"read GPU {i}'s persistence mode", self._nv.nvmlDeviceGetPersistenceMode, h, absent=no)
            cm = self._maybe(f"read GPU {i}'s compute mode", self._nv.nvmlDeviceGetComputeMode, h, absent=no)
            card = cat.find_card(name)
            out.append(
                GpuDevice(
                    index=i,
                    name=name,
                    uuid=text_of(self._call(f"read GPU {i}'s UUID", self._nv.nvmlDeviceGetUUID, h)),
                    minor=self._minor(i, h),
                    memory_mib=int(self._call(f"read GPU {i}'s memory", self._nv.nvmlDeviceGetMemoryInfo, h).total)
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
        got = self._maybe(
            f"read GPU {index}'s minor number", self._nv.nvmlDeviceGetMinorNumber, h, absent=(nv.NOT_SUPPORTED,)
        )
        return index if got is None else int(got)

    def _profile_info(self, index: int, h: Any, const: int, name: str) -> Any:
        """GetGpuInstanceProfileInfo, v2 (with the name) or, on a driver without it, v1."""
        what = f"read GPU {index}'s MIG profile {name}"
        absent = (nv.NOT_SUPPORTED, nv.INVALID_ARGUMENT, nv.NOT_FOUND)
        try:
            return self._maybe(what, self._nv.nvmlDeviceGetGpuInstanceProfileInfo, h, const, absent=absent)
        except nv.GpuDriverError as exc:
            if exc.code not in (nv.ARGUMENT_VERSION_MISMATCH, nv.FUNCTION_NOT_FOUND):
                raise
        return self._maybe(what, self._nv.nvmlDeviceGetGpuInstanceProfileInfo, h, const, 1, absent=absent)

    def driver_profiles(self, index: int) -> dict[int, DriverProfile]:
        """The GPU-instance profiles the driver offers on one GPU (needs MIG mode on), by profile id."""
        if index in self._profiles:
            return self._profiles[index]
        h = self._handle(index)
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
            self._call(
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
            gi = self._maybe(
                f"look up GPU {index}'s GPU instance {gi_id}",
                self._nv.nvmlDeviceGetGpuInstanceById,
                h,
                gi_id,
                absent=(nv.NOT_FOUND, nv.INVALID_ARGUMENT),
            )
            if gi is not None:
                out.append((gi, self._call(f"read GPU instance {gi_id}", self._nv.nvmlGpuInstanceGetInfo, gi)))
        return out

    def _ci_infos(self, gi: Any) -> list[Any]:
        out = []
        for ci_id in range(_MAX_CI_ID):
            ci = self._maybe(
                f"look up compute instance {ci_id}",
                self._nv.nvmlGpuInstanceGetComputeInstanceById,
                gi,
                ci_id,
                absent=(nv.NOT_FOUND, nv.INVALID_ARGUMENT),
            )
            if ci is not None:
                out.append(self._call(f"read compute instance {ci_id}", self._nv.nvmlComputeInstanceGetInfo, ci))
        return out

    def _ci_slices(self, gi: Any, ci_profile_id: int) -> int:
        """Compute slices of a CI profile id (by asking the driver for each CI profile's id)."""
        for n, suffix in COMPUTE_INSTANCE_PROFILES.items():
            info = self._maybe(
                "read a compute-instance profile",
                self._nv.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gi,
                self._const("NVML_COMPUTE_INSTANCE_PROFILE_", suffix),
                self._const("NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_", "SHARED"),
                absent=(nv.NOT_SUPPORTED, nv.INVALID_ARGUMENT),
            )
            if info is not None and int(info.id) == ci_profile_id:
                return int(info.sliceCount) or n
        return 0

    def gpu_instances(self, index: int) -> list[GpuInstance]:
        h = self._handle(index)
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

    def _mig_handles(self, index: int, h: Any) -> list[Any]:
        n = int(self._call(f"count GPU {index}'s MIG devices", self._nv.nvmlDeviceGetMaxMigDeviceCount, h))
        out = []
        for i in range(n):
            m = self._maybe(
                f"open GPU {index}'s MIG device {i}",
                self._nv.nvmlDeviceGetMigDeviceHandleByIndex,
                h,
                i,
                absent=(nv.NOT_FOUND, nv.INVALID_ARGUMENT),
            )
            if m is not None:
                out.append(m)
        return out

    def _mig_devices_of(self, index: int, h: Any) -> list[MigDevice]:
        profiles = self.driver_profiles(index)
        gis = {int(info.id): info for _, info in self._gi_handles(index, h)}
        uuid = text_of(self._call(f"read GPU {index}'s UUID", self._nv.nvmlDeviceGetUUID, h))
        minor = self._minor(index, h)
        out = []
        for m in self._mig_handles(index, h):
            gi_id = int(self._call("read a MIG device's GPU instance", self._nv.nvmlDeviceGetGpuInstanceId, m))
            ci_id = int(self._call("read a MIG device's compute instance", self._nv.nvmlDeviceGetComputeInstanceId, m))
            info = gis.get(gi_id)
            p = profiles.get(int(info.profileId)) if info is not None else None
            attrs = self._maybe(
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
                    uuid=text_of(self._call("read a MIG device's UUID", self._nv.nvmlDeviceGetUUID, m)),
                    memory_mib=int(self._call("read a MIG device's memory", self._nv.nvmlDeviceGetMemoryInfo, m).total)
                    >> 20,
                    sms=int(attrs.multiprocessorCount) if attrs is not None else None,
                )
            )
        return sorted(out, key=lambda d: (d.placement_start, d.ci_id))

    call, maybe, handle, mig_handles = _call, _maybe, _handle, _mig_handles  # for calque.gpu.nvml_sampling

    def mig_devices(self) -> list[MigDevice]:
        out: list[MigDevice] = []
        for i in range(self.count()):
            if self.mig_mode(i)[0]:
                out += self._mig_devices_of(i, self._handle(i))
        return out

    def _procs(self, what: str, h: Any, device_uuid: str) -> list[GpuProcess]:
        got = self._call(f"list {what}'s processes", self._nv.nvmlDeviceGetComputeRunningProcesses, h)
        return [
            GpuProcess(pid=int(p.pid), used_memory_mib=int(p.usedGpuMemory or 0) >> 20, device_uuid=device_uuid)
            for p in got
        ]

    def processes(self) -> list[GpuProcess]:
        out: list[GpuProcess] = []
        for i in range(self.count()):
            h = self._handle(i)
            if self.mig_mode(i)[0]:
                for m in self._mig_handles(i, h):
                    out += self._procs(
                        f"GPU {i}'s MIG device", m, text_of(self._call("read UUID", self._nv.nvmlDeviceGetUUID, m))
                    )
            else:
                out += self._procs(f"GPU {i}", h, text_of(self._call("read UUID", self._nv.nvmlDeviceGetUUID, h)))
        return out

    def utilisation(self) -> list[DeviceSample]:
        if self._sampler is None:  # keeps GPM samples between calls: see calque.gpu.nvml_sampling
            self._sampler = NvmlSampler(self)
        return self._sampler.take()

    def capability_devices(self, mig: MigDevice) -> list[str]:
        return [str(p) for p in mig_capability_devices(mig, "/")]

    # -- changes ------------------------------------------------------------------------------

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        mode = self._const("NVML_DEVICE_MIG_", "ENABLE" if enabled else "DISABLE")
        self._call(f"set GPU {index}'s MIG mode", self._nv.nvmlDeviceSetMigMode, self._handle(index), mode)
        self._profiles.pop(index, None)

    def reset_gpu(self, index: int) -> None:
        nvidia_smi_reset(index)
        self._profiles.pop(index, None)

    def create_gpu_instance(self, index: int, profile_id: int, start: int) -> GpuInstance:
        h = self._handle(index)
        p = self.driver_profiles(index).get(profile_id)
        if p is None:
            raise nv.driver_error(nv.INVALID_ARGUMENT, f"GPU {index} offers no GPU-instance profile id {profile_id}")
        placement = self._nv.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, p.size
        gi = self._call(
            f"create a {p.name} instance at {start} on GPU {index}",
            self._nv.nvmlDeviceCreateGpuInstanceWithPlacement,
            h,
            profile_id,
            ctypes.byref(placement),
        )
        info = self._call("read the new GPU instance", self._nv.nvmlGpuInstanceGetInfo, gi)
        return GpuInstance(
            gpu_index=index,
            gi_id=int(info.id),
            profile=p.name,
            profile_id=profile_id,
            placement_start=int(info.placement.start),
            placement_size=max(1, int(info.placement.size)),
        )

    def _gi(self, index: int, gi_id: int) -> Any:
        return self._call(
            f"look up GPU {index}'s GPU instance {gi_id}",
            self._nv.nvmlDeviceGetGpuInstanceById,
            self._handle(index),
            gi_id,
        )

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        self._call(
            f"destroy GPU {index}'s GPU instance {gi_id}", self._nv.nvmlGpuInstanceDestroy, self._gi(index, gi_id)
        )

    def create_compute_instance(self, index: int, gi_id: int, compute_slices: int) -> int:
        suffix = COMPUTE_INSTANCE_PROFILES.get(compute_slices)
        if suffix is None:
            raise nv.driver_error(nv.INVALID_ARGUMENT, f"no {compute_slices}-slice compute-instance profile")
        gi = self._gi(index, gi_id)
        info = self._call(
            f"read the {compute_slices}-slice compute-instance profile",
            self._nv.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            gi,
            self._const("NVML_COMPUTE_INSTANCE_PROFILE_", suffix),
            self._const("NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_", "SHARED"),
        )
        ci = self._call(
            f"create a compute instance in GPU {index}'s GPU instance {gi_id}",
            self._nv.nvmlGpuInstanceCreateComputeInstance,
            gi,
            int(info.id),
        )
        return int(self._call("read the new compute instance", self._nv.nvmlComputeInstanceGetInfo, ci).id)

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        gi = self._gi(index, gi_id)
        ci = self._call(
            f"look up compute instance {ci_id} of GPU instance {gi_id}",
            self._nv.nvmlGpuInstanceGetComputeInstanceById,
            gi,
            ci_id,
        )
        self._call(f"destroy compute instance {ci_id} of GPU instance {gi_id}", self._nv.nvmlComputeInstanceDestroy, ci)

    def set_compute_mode(self, index: int, mode: str) -> None:
        if mode not in COMPUTE_MODES:
            raise nv.driver_error(nv.INVALID_ARGUMENT, f"compute mode {mode!r}; valid: {', '.join(COMPUTE_MODES)}")
        self._call(
            f"set GPU {index}'s compute mode to {mode}",
            self._nv.nvmlDeviceSetComputeMode,
            self._handle(index),
            self._const("NVML_COMPUTEMODE_", mode),
        )
