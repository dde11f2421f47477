"""A stand-in for ``libnvidia-ml.so.1`` under the real ``pynvml`` wrappers (read-only functions only).

pynvml looks every C function up on ``pynvml.nvmlLib`` and calls it with ctypes arguments (buffers,
``byref`` structs, placement arrays). Installing an instance as ``nvmlLib`` runs calque's NVML code
through pynvml's real ctypes layer, so ``calque gpu verify`` is tested down to the C boundary. Only
getters exist: a lookup of any other function fails as it would on an old driver, and the names
looked up are recorded so a test can prove verify never reaches a setter.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml as real
from calque.gpu.catalog import load_catalog

SUCCESS = 0


def _handle_index(h: Any) -> int:
    return int(ctypes.cast(h, ctypes.c_void_p).value or 0) - 1


class FakeLibNvml:
    def __init__(self, card_key: str, count: int = 1, mig: bool = True, driver: bytes = b"595.91.07") -> None:
        self.card = load_catalog().cards[card_key]
        self.count = count
        self.mig = mig
        self.driver = driver
        self.looked_up: list[str] = []
        self.overrides: dict[tuple[str, str], Any] = {}  # (profile name, field) -> value
        self.profiles_when_mig_off = False
        self.old_driver = False  # True: the v2 profile-info call answers ARGUMENT_VERSION_MISMATCH

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("_", "c_")) or name in (
            "card",
            "count",
            "mig",
            "driver",
            "looked_up",
            "overrides",
            "old_driver",
        ):
            raise AttributeError(name)
        self.looked_up.append(name)
        fn = getattr(self, "c_" + name, None)
        if fn is None:
            raise AttributeError(name)  # pynvml turns this into NVML_ERROR_FUNCTION_NOT_FOUND
        return fn

    # -- C functions ----------------------------------------------------------------------------

    class _ErrorString:
        restype: Any = None  # pynvml sets it to c_char_p

        def __call__(self, code: int) -> bytes:
            return f"fake NVML error {code}".encode()

    c_nvmlErrorString = _ErrorString()

    def c_nvmlInitWithFlags(self, flags: int) -> int:
        return SUCCESS

    def c_nvmlShutdown(self) -> int:
        return SUCCESS

    def c_nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        buf.value = self.driver
        return SUCCESS

    def c_nvmlDeviceGetCount_v2(self, count: Any) -> int:
        count._obj.value = self.count
        return SUCCESS

    def c_nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> int:
        if not 0 <= index.value < self.count:
            return real.NVML_ERROR_INVALID_ARGUMENT
        addr = ctypes.c_void_p(index.value + 1)
        ctypes.memmove(ctypes.addressof(device._obj), ctypes.addressof(addr), ctypes.sizeof(addr))
        return SUCCESS

    def c_nvmlDeviceGetName(self, h: Any, buf: Any, size: Any) -> int:
        buf.value = self.card.nvml_names[0].encode()
        return SUCCESS

    def c_nvmlDeviceGetUUID(self, h: Any, buf: Any, size: Any) -> int:
        buf.value = b"GPU-00000000-0000-0000-0000-%012d" % _handle_index(h)
        return SUCCESS

    def c_nvmlDeviceGetMinorNumber(self, h: Any, out: Any) -> int:
        out._obj.value = _handle_index(h)
        return SUCCESS

    def c_nvmlDeviceGetMemoryInfo(self, h: Any, mem: Any) -> int:
        mem._obj.total = self.card.memory_mib << 20
        return SUCCESS

    def c_nvmlDeviceGetPciInfo_v3(self, h: Any, info: Any) -> int:
        info._obj.pciDeviceId = int(self.card.pci_device_ids[0], 16) if self.card.pci_device_ids else 0
        return SUCCESS

    def c_nvmlDeviceGetMigMode(self, h: Any, current: Any, pending: Any) -> int:
        if not self.card.mig:
            return real.NVML_ERROR_NOT_SUPPORTED
        current._obj.value = pending._obj.value = int(self.mig)
        return SUCCESS

    def c_nvmlDeviceGetPersistenceMode(self, h: Any, out: Any) -> int:
        out._obj.value = 1
        return SUCCESS

    def c_nvmlDeviceGetComputeMode(self, h: Any, out: Any) -> int:
        out._obj.value = 0
        return SUCCESS

    def _profile(self, const: int) -> Any:
        for p in self.card.profiles:
            if getattr(real, "NVML_GPU_INSTANCE_PROFILE_" + p.nvml_constant) == const:
                return p
        return None

    def c_nvmlDeviceGetGpuInstanceProfileInfoV(self, h: Any, const: int, info: Any) -> int:
        if self.old_driver:
            return real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        if not self.mig and not self.profiles_when_mig_off:
            return real.NVML_ERROR_NOT_SUPPORTED
        p = self._profile(const)
        if p is None:
            return real.NVML_ERROR_NOT_SUPPORTED
        o = info._obj
        assert o.version == real.nvmlGpuInstanceProfileInfo_v2, "pynvml must pass a versioned v2 struct"
        o.id = self.overrides.get((p.name, "profile_id"), p.profile_id)
        o.sliceCount = p.compute_slices
        o.instanceCount = self.overrides.get((p.name, "max_count"), p.max_count)
        o.multiprocessorCount = self.card.profile_sms(p) or 0
        o.memorySizeMB = self.card.profile_memory_mib(p)
        o.name = b"MIG " + p.name.encode()
        return SUCCESS

    def c_nvmlDeviceGetGpuInstanceProfileInfo(self, h: Any, const: int, info: Any) -> int:
        """v1: no version field and no name (older drivers)."""
        if not self.mig:
            return real.NVML_ERROR_NOT_SUPPORTED
        p = self._profile(const)
        if p is None:
            return real.NVML_ERROR_NOT_SUPPORTED
        o = info._obj
        o.id, o.sliceCount, o.instanceCount = p.profile_id, p.compute_slices, p.max_count
        o.multiprocessorCount, o.memorySizeMB = self.card.profile_sms(p) or 0, self.card.profile_memory_mib(p)
        return SUCCESS

    def c_nvmlDeviceGetGpuInstancePossiblePlacements_v2(self, h: Any, profile_id: int, arr: Any, count: Any) -> int:
        p = next(
            (q for q in self.card.profiles if self.overrides.get((q.name, "profile_id"), q.profile_id) == profile_id),
            None,
        )
        if p is None:
            return real.NVML_ERROR_INVALID_ARGUMENT
        starts = self.overrides.get((p.name, "starts"), p.placements.starts)
        if len(starts) > len(arr):
            return real.NVML_ERROR_INSUFFICIENT_SIZE
        for i, s in enumerate(starts):
            arr[i].start, arr[i].size = s, p.placements.size
        count._obj.value = len(starts)
        return SUCCESS
