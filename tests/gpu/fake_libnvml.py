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
        self.gpm = False  # GPM (Hopper and later); read-only queries and samples, never streaming
        self.util = 0.0  # the GPU's SM and graphics activity, %
        self.gpm_samples: dict[int, Any] = {}  # address -> (buffer, the clock when sampled or None)
        self.clock = 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("_", "c_")) or name in (
            "card",
            "count",
            "mig",
            "driver",
            "looked_up",
            "overrides",
            "old_driver",
            "gpm",
            "util",
            "gpm_samples",
            "clock",
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

    # -- utilisation (reads only) ------------------------------------------------------------------

    def c_nvmlDeviceGetComputeRunningProcesses_v3(self, h: Any, count: Any, procs: Any) -> int:
        count._obj.value = 0
        return SUCCESS  # pynvml's special case: no running processes

    def c_nvmlDeviceGetUtilizationRates(self, h: Any, util: Any) -> int:
        if self.mig:
            return real.NVML_ERROR_NOT_SUPPORTED
        util._obj.gpu = int(self.util)
        return SUCCESS

    def c_nvmlGpmQueryDeviceSupport(self, h: Any, support: Any) -> int:
        assert support._obj.version == real.NVML_GPM_SUPPORT_VERSION
        support._obj.isSupportedDevice = int(self.gpm)
        return SUCCESS

    def c_nvmlGpmSampleAlloc(self, out: Any) -> int:
        buf = ctypes.create_string_buffer(64)  # the opaque sample the driver would allocate
        addr = ctypes.c_void_p(ctypes.addressof(buf))
        ctypes.memmove(ctypes.addressof(out._obj), ctypes.addressof(addr), ctypes.sizeof(addr))
        self.gpm_samples[ctypes.addressof(buf)] = [buf, None]
        return SUCCESS

    def _sample(self, s: Any) -> Any:
        return self.gpm_samples.get(int(ctypes.cast(s, ctypes.c_void_p).value or 0))

    def c_nvmlGpmSampleFree(self, s: Any) -> int:
        if self._sample(s) is None:
            return real.NVML_ERROR_INVALID_ARGUMENT
        del self.gpm_samples[int(ctypes.cast(s, ctypes.c_void_p).value or 0)]
        return SUCCESS

    def c_nvmlGpmSampleGet(self, h: Any, s: Any) -> int:
        got = self._sample(s)
        if got is None or not self.gpm:
            return real.NVML_ERROR_INVALID_ARGUMENT if got is None else real.NVML_ERROR_NOT_SUPPORTED
        self.clock += 1
        got[1] = self.clock
        return SUCCESS

    def c_nvmlGpmMetricsGet(self, ref: Any) -> int:
        mg = ref._obj
        a, b = self._sample(mg.sample1), self._sample(mg.sample2)
        if mg.version != real.NVML_GPM_METRICS_GET_VERSION:
            return real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        if a is None or b is None or a[1] is None or b[1] is None or a[1] >= b[1]:
            return real.NVML_ERROR_INVALID_ARGUMENT
        for i in range(mg.numMetrics):
            ok = mg.metrics[i].metricId in (real.NVML_GPM_METRIC_SM_UTIL, real.NVML_GPM_METRIC_GRAPHICS_UTIL)
            mg.metrics[i].value = self.util if ok else 0.0
            mg.metrics[i].nvmlReturn = SUCCESS if ok else real.NVML_ERROR_NOT_SUPPORTED
        return SUCCESS
