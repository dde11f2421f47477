"""A strict stand-in for the ``pynvml`` module: the NVML boundary of calque's NVML backend.

It speaks pynvml's function signatures (ctypes placement arrays included), raises pynvml's own
``NVMLError`` with real codes, refuses calls before ``nvmlInit`` and handles of the wrong kind, and
records every call so tests can assert call sequences (e.g. that ``verify`` never changes a card).
Cards are built from the catalog, so a card that matches the catalog verifies with no differences.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as real
from calque.gpu.catalog import load_catalog

MUTATING = {
    "nvmlDeviceSetMigMode",
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceDestroy",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlComputeInstanceDestroy",
    "nvmlDeviceSetComputeMode",
}
_CI_CONST = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}  # NVML_COMPUTE_INSTANCE_PROFILE_* -> slices


@dataclass
class FakeGi:
    gi_id: int
    profile_id: int
    start: int
    size: int
    cis: dict[int, int] = field(default_factory=dict)  # ci_id -> compute slices


@dataclass
class FakeCard:
    name: str
    uuid: str
    minor: int
    memory_mib: int
    mig: list[int] | None  # [current, pending]; None: MIG not supported
    profiles: list[dict[str, Any]]
    gis: dict[int, FakeGi] = field(default_factory=dict)
    persistence: int = 0
    compute_mode: int = 0
    pci_device_id: int = 0
    processes: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    gpm: bool = False  # Hopper and later: GPM samples of the GPU and of each GPU instance
    util: dict[str, float] = field(default_factory=dict)  # "gpu" or "gi<N>" -> activity % now
    used_mib: dict[str, int] = field(default_factory=dict)  # device UUID -> memory used
    process_util: dict[int, int] | None = None  # pid -> SM % (None: per-process use not supported)


@dataclass(frozen=True)
class Dev:
    index: int


@dataclass(frozen=True)
class GiH:
    index: int
    gi_id: int


@dataclass(frozen=True)
class CiH:
    index: int
    gi_id: int
    ci_id: int


@dataclass(frozen=True)
class MigH:
    index: int
    gi_id: int
    ci_id: int


def card_from_catalog(key: str, index: int = 0, mig: bool = True) -> FakeCard:
    c = load_catalog().cards[key]
    profiles = [
        {
            "const": int(getattr(real, "NVML_GPU_INSTANCE_PROFILE_" + p.nvml_constant)),
            "id": p.profile_id,
            "name": f"MIG {p.name}",
            "slices": p.compute_slices,
            "count": p.max_count,
            "sms": c.profile_sms(p) or 0,
            "mem": c.profile_memory_mib(p),
            "starts": list(p.placements.starts),
            "size": p.placements.size,
        }
        for p in c.profiles
    ]
    return FakeCard(
        name=c.nvml_names[0],
        uuid=f"GPU-00000000-0000-0000-0000-{index:012d}",
        minor=index,
        memory_mib=c.memory_mib,
        mig=([1, 1] if mig else [0, 0]) if c.mig else None,
        profiles=profiles,
        pci_device_id=int(c.pci_device_ids[0], 16) if c.pci_device_ids else 0x12345678,
    )


class FakePynvml:
    """Install with ``monkeypatch.setitem(sys.modules, "pynvml", fake)``."""

    NVMLError = real.NVMLError
    c_nvmlGpuInstancePlacement_t = real.c_nvmlGpuInstancePlacement_t
    c_nvmlGpmMetricsGet_t = real.c_nvmlGpmMetricsGet_t

    def __init__(self, cards: list[FakeCard], driver: str = "595.91.07") -> None:
        self.cards = cards
        self.driver = driver
        self.calls: list[str] = []
        self.fail: dict[str, int] = {}  # function name -> NVML error code to raise
        self.init_error: int | None = None
        self.initialised = False
        self.clock = 0  # advances at every GPM sample, as the GPU's own counters would
        self.samples: dict[int, tuple[int, str, int] | None] = {}  # allocated GPM samples: (index, key, time)
        for k in dir(real):
            if k.startswith("NVML_") and isinstance(getattr(real, k), int):
                setattr(self, k, getattr(real, k))

    # -- plumbing -----------------------------------------------------------------------------

    def _enter(self, fn: str) -> None:
        self.calls.append(fn)
        if fn not in ("nvmlInit",) and not self.initialised:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)
        if fn in self.fail:
            raise real.NVMLError(self.fail[fn])

    @staticmethod
    def _err(code: int) -> real.NVMLError:
        return real.NVMLError(code)

    def _dev(self, h: Any) -> FakeCard:
        if type(h) is not Dev or not 0 <= h.index < len(self.cards):
            raise self._err(real.NVML_ERROR_INVALID_ARGUMENT)
        return self.cards[h.index]

    def _mig_on(self, c: FakeCard) -> None:
        if c.mig is None or not c.mig[0]:
            raise self._err(real.NVML_ERROR_NOT_SUPPORTED)

    def _gi(self, h: Any) -> tuple[FakeCard, FakeGi]:
        if type(h) is not GiH:
            raise self._err(real.NVML_ERROR_INVALID_ARGUMENT)
        c = self.cards[h.index]
        if h.gi_id not in c.gis:
            raise self._err(real.NVML_ERROR_INVALID_ARGUMENT)
        return c, c.gis[h.gi_id]

    def _profile(self, c: FakeCard, profile_id: int) -> dict[str, Any]:
        for p in c.profiles:
            if p["id"] == profile_id:
                return p
        raise self._err(real.NVML_ERROR_INVALID_ARGUMENT)

    def _mig_uuid(self, index: int, gi: int, ci: int) -> str:
        return f"MIG-00000000-0000-0000-{index:04d}-{gi:06d}{ci:06d}"

    # -- NVML ---------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise real.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Dev:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.cards):
            raise self._err(real.NVML_ERROR_INVALID_ARGUMENT)
        return Dev(index)

    def nvmlDeviceGetName(self, h: Any) -> str:
        self._enter("nvmlDeviceGetName")
        return self._dev(h).name

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        self._enter("nvmlDeviceGetUUID")
        if type(h) is MigH:
            return self._mig_uuid(h.index, h.gi_id, h.ci_id)
        return self._dev(h).uuid

    def nvmlDeviceGetMinorNumber(self, h: Any) -> int:
        self._enter("nvmlDeviceGetMinorNumber")
        return self._dev(h).minor

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo")
        if type(h) is MigH:
            c = self.cards[h.index]
            used = c.used_mib.get(self._mig_uuid(h.index, h.gi_id, h.ci_id), 0) << 20
            return SimpleNamespace(total=self._profile(c, c.gis[h.gi_id].profile_id)["mem"] << 20, used=used)
        c = self._dev(h)
        return SimpleNamespace(total=c.memory_mib << 20, used=c.used_mib.get(c.uuid, 0) << 20)

    def nvmlDeviceGetPciInfo(self, h: Any) -> SimpleNamespace:
        self._enter("nvmlDeviceGetPciInfo")
        return SimpleNamespace(pciDeviceId=self._dev(h).pci_device_id)

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        self._enter("nvmlDeviceGetMigMode")
        c = self._dev(h)
        if c.mig is None:
            raise self._err(real.NVML_ERROR_NOT_SUPPORTED)
        return list(c.mig)

    def nvmlDeviceGetPersistenceMode(self, h: Any) -> int:
        self._enter("nvmlDeviceGetPersistenceMode")
        return self._dev(h).persistence

    def nvmlDeviceGetComputeMode(self, h: Any) -> int:
        self._enter("nvmlDeviceGetComputeMode")
        return self._dev(h).compute_mode

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: Any, const: int, version: int = 2) -> SimpleNamespace:
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo")
        c = self._dev(h)
        self._mig_on(c)
        for p in c.profiles:
            if p["const"] == const:
                return SimpleNamespace(
                    id=p["id"], sliceCount=p["slices"], instanceCount=p["count"], multiprocessorCount=p["sms"],
                    memorySizeMB=p["mem"], name=p["name"].encode(),
                )  # fmt: skip
        raise self._err(real.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, h: Any, profile_id: int, placements: Any, count: Any) -> int:
        self._enter("nvmlDeviceGetGpuInstancePossiblePlacements")
        c = self._dev(h)
        self._mig_on(c)
        p = self._profile(c, profile_id)
        cap = count._obj.value
        if len(p["starts"]) > cap:
            raise self._err(real.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, s in enumerate(p["starts"]):
            placements[i].start, placements[i].size = s, p["size"]
        count._obj.value = len(p["starts"])
        return 0

    def nvmlDeviceGetGpuInstanceById(self, h: Any, gi_id: int) -> GiH:
        self._enter("nvmlDeviceGetGpuInstanceById")
        c = self._dev(h)
        self._mig_on(c)
        if gi_id not in c.gis:
            raise self._err(real.NVML_ERROR_NOT_FOUND)
        return GiH(h.index, gi_id)

    def nvmlGpuInstanceGetInfo(self, gi: Any) -> SimpleNamespace:
        self._enter("nvmlGpuInstanceGetInfo")
        _, g = self._gi(gi)
        return SimpleNamespace(
            id=g.gi_id, profileId=g.profile_id, placement=SimpleNamespace(start=g.start, size=g.size)
        )

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: Any, ci_id: int) -> CiH:
        self._enter("nvmlGpuInstanceGetComputeInstanceById")
        _, g = self._gi(gi)
        if ci_id not in g.cis:
            raise self._err(real.NVML_ERROR_NOT_FOUND)
        return CiH(gi.index, gi.gi_id, ci_id)

    def nvmlComputeInstanceGetInfo(self, ci: Any) -> SimpleNamespace:
        self._enter("nvmlComputeInstanceGetInfo")
        if type(ci) is not CiH:
            raise self._err(real.NVML_ERROR_INVALID_ARGUMENT)
        n = self.cards[ci.index].gis[ci.gi_id].cis[ci.ci_id]
        return SimpleNamespace(id=ci.ci_id, profileId=100 + n)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: Any, const: int, eng: int, version: int = 2) -> Any:
        self._enter("nvmlGpuInstanceGetComputeInstanceProfileInfo")
        c, g = self._gi(gi)
        n = _CI_CONST.get(const)
        if n is None or n > self._profile(c, g.profile_id)["slices"] or eng != 0:
            raise self._err(real.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=100 + n, sliceCount=n)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount")
        c = self._dev(h)
        return 0 if c.mig is None else 7

    def _mig_list(self, index: int) -> list[MigH]:
        c = self.cards[index]
        return [MigH(index, g.gi_id, ci) for g in sorted(c.gis.values(), key=lambda g: g.gi_id) for ci in sorted(g.cis)]

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, i: int) -> MigH:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex")
        c = self._dev(h)
        self._mig_on(c)
        migs = self._mig_list(h.index)
        if i >= len(migs):
            raise self._err(real.NVML_ERROR_NOT_FOUND)
        return migs[i]

    def nvmlDeviceGetGpuInstanceId(self, m: Any) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId")
        if type(m) is not MigH:
            raise self._err(real.NVML_ERROR_INVALID_ARGUMENT)
        return m.gi_id

    def nvmlDeviceGetComputeInstanceId(self, m: Any) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId")
        if type(m) is not MigH:
            raise self._err(real.NVML_ERROR_INVALID_ARGUMENT)
        return m.ci_id

    def nvmlDeviceGetAttributes(self, m: Any) -> SimpleNamespace:
        self._enter("nvmlDeviceGetAttributes")
        if type(m) is not MigH:
            raise self._err(real.NVML_ERROR_NOT_SUPPORTED)
        c = self.cards[m.index]
        g = c.gis[m.gi_id]
        p = self._profile(c, g.profile_id)
        return SimpleNamespace(multiprocessorCount=p["sms"] * g.cis[m.ci_id] // p["slices"])

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        if type(h) is MigH:
            key = self._mig_uuid(h.index, h.gi_id, h.ci_id)
            c = self.cards[h.index]
        else:
            c = self._dev(h)
            key = c.uuid
        return [SimpleNamespace(pid=pid, usedGpuMemory=mib << 20) for pid, mib in c.processes.get(key, [])]

    # -- changes ------------------------------------------------------------------------------

    def nvmlDeviceSetMigMode(self, h: Any, mode: int) -> int:
        self._enter("nvmlDeviceSetMigMode")
        c = self._dev(h)
        if c.mig is None:
            raise self._err(real.NVML_ERROR_NOT_SUPPORTED)
        if not mode and c.gis:
            raise self._err(real.NVML_ERROR_IN_USE)
        c.mig[1] = mode
        return 0

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: Any, profile_id: int, placement: Any) -> GiH:
        self._enter("nvmlDeviceCreateGpuInstanceWithPlacement")
        c = self._dev(h)
        self._mig_on(c)
        pl = placement._obj  # pynvml passes the pointer straight to C: it must be byref(struct)
        if not isinstance(pl, real.c_nvmlGpuInstancePlacement_t):
            raise self._err(real.NVML_ERROR_INVALID_ARGUMENT)
        p = self._profile(c, profile_id)
        if pl.start not in p["starts"] or pl.size != p["size"]:
            raise self._err(real.NVML_ERROR_INVALID_ARGUMENT)
        used = {s for g in c.gis.values() for s in range(g.start, g.start + g.size)}
        if used & set(range(pl.start, pl.start + pl.size)):
            raise self._err(real.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = next(i for i in range(1, 15) if i not in c.gis)
        c.gis[gi_id] = FakeGi(gi_id, profile_id, pl.start, pl.size)
        return GiH(h.index, gi_id)

    def nvmlGpuInstanceDestroy(self, gi: Any) -> int:
        self._enter("nvmlGpuInstanceDestroy")
        c, g = self._gi(gi)
        if g.cis:
            raise self._err(real.NVML_ERROR_IN_USE)
        del c.gis[g.gi_id]
        return 0

    def nvmlGpuInstanceCreateComputeInstance(self, gi: Any, ci_profile_id: int) -> CiH:
        self._enter("nvmlGpuInstanceCreateComputeInstance")
        c, g = self._gi(gi)
        n = ci_profile_id - 100
        if sum(g.cis.values()) + n > self._profile(c, g.profile_id)["slices"]:
            raise self._err(real.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = next(i for i in range(8) if i not in g.cis)
        g.cis[ci_id] = n
        return CiH(gi.index, gi.gi_id, ci_id)

    def nvmlComputeInstanceDestroy(self, ci: Any) -> int:
        self._enter("nvmlComputeInstanceDestroy")
        if type(ci) is not CiH:
            raise self._err(real.NVML_ERROR_INVALID_ARGUMENT)
        c = self.cards[ci.index]
        if c.processes.get(self._mig_uuid(ci.index, ci.gi_id, ci.ci_id)):
            raise self._err(real.NVML_ERROR_IN_USE)
        del c.gis[ci.gi_id].cis[ci.ci_id]
        return 0

    def nvmlDeviceSetComputeMode(self, h: Any, mode: int) -> None:
        self._enter("nvmlDeviceSetComputeMode")
        self._dev(h).compute_mode = mode

    # -- utilisation (reads): GPM as nvidia-ml-py shapes it, utilisation rates, per-process use ------

    def nvmlGpmQueryDeviceSupport(self, h: Any) -> Any:
        self._enter("nvmlGpmQueryDeviceSupport")
        out = real.c_nvmlGpmSupport_t()
        out.version = real.NVML_GPM_SUPPORT_VERSION
        out.isSupportedDevice = int(self._dev(h).gpm)
        return out

    def _sample_id(self, s: Any) -> int:
        if not isinstance(s, real.c_nvmlGpmSample_t) or not s or ctypes.addressof(s.contents) not in self.samples:
            raise self._err(real.NVML_ERROR_INVALID_ARGUMENT)
        return ctypes.addressof(s.contents)

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        s = real.c_nvmlGpmSample_t(real.struct_c_nvmlGpmSample_t())
        self.samples[ctypes.addressof(s.contents)] = None
        return s

    def nvmlGpmSampleFree(self, s: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        del self.samples[self._sample_id(s)]

    def nvmlGpmSampleGet(self, h: Any, s: Any) -> Any:
        self._enter("nvmlGpmSampleGet")
        c = self._dev(h)  # a MIG device handle is refused: GPM samples a GPU, or a GI through its GPU
        if not c.gpm:
            raise self._err(real.NVML_ERROR_NOT_SUPPORTED)
        self.clock += 1
        self.samples[self._sample_id(s)] = (h.index, "gpu", self.clock)
        return s

    def nvmlGpmMigSampleGet(self, h: Any, gi_id: int, s: Any) -> Any:
        self._enter("nvmlGpmMigSampleGet")
        c = self._dev(h)
        self._mig_on(c)
        if not c.gpm:
            raise self._err(real.NVML_ERROR_NOT_SUPPORTED)
        if gi_id not in c.gis:
            raise self._err(real.NVML_ERROR_NOT_FOUND)
        self.clock += 1
        self.samples[self._sample_id(s)] = (h.index, f"gi{gi_id}", self.clock)
        return s

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        if not isinstance(mg, real.c_nvmlGpmMetricsGet_t) or mg.version != real.NVML_GPM_METRICS_GET_VERSION:
            raise self._err(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        a, b = self.samples.get(self._sample_id(mg.sample1)), self.samples.get(self._sample_id(mg.sample2))
        if a is None or b is None or a[:2] != b[:2] or a[2] >= b[2]:
            raise self._err(real.NVML_ERROR_INVALID_ARGUMENT)  # unfilled, different devices, or out of order
        known = (real.NVML_GPM_METRIC_SM_UTIL, real.NVML_GPM_METRIC_GRAPHICS_UTIL)
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            if m.metricId in known:
                m.value, m.nvmlReturn = self.cards[b[0]].util.get(b[1], 0.0), real.NVML_SUCCESS
            else:
                m.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return mg

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates")
        c = self._dev(h)  # not on MIG devices, nor on a GPU in MIG mode
        if c.mig is not None and c.mig[0]:
            raise self._err(real.NVML_ERROR_NOT_SUPPORTED)
        out = real.c_nvmlUtilization_t()
        out.gpu, out.memory = int(c.util.get("gpu", 0)), 0
        return out

    def nvmlDeviceGetProcessUtilization(self, h: Any, since: int) -> list[Any]:
        self._enter("nvmlDeviceGetProcessUtilization")
        c = self._dev(h)
        if c.process_util is None or (c.mig is not None and c.mig[0]):
            raise self._err(real.NVML_ERROR_NOT_SUPPORTED)
        self.clock += 1
        out = []
        for pid, sm in sorted(c.process_util.items()):
            x = real.c_nvmlProcessUtilizationSample_t()
            x.pid, x.timeStamp, x.smUtil = pid, self.clock, sm
            out.append(x)
        if not out:
            raise self._err(real.NVML_ERROR_NOT_FOUND)  # no sample since ``since``
        return out
