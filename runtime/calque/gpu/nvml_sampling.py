"""Utilisation through NVML: GPM on Hopper and later, utilisation rates on whole GPUs, and processes.

GPM (GPU Performance Monitoring) metrics are computed between two samples taken an interval apart.
The sampler keeps each device's last sample and, at the next call, computes SM and graphics activity
between it and a fresh one, so a call after the first costs no wait (the first measures
``FIRST_INTERVAL_S`` itself). A MIG device is sampled through its parent GPU and its GPU-instance id
(``nvmlGpmMigSampleGet``): compute instances of one GPU instance share its figures. Where GPM is not
supported (before Hopper; A100 MIG) a MIG device's activity is unknown; a whole GPU falls back to
``nvmlDeviceGetUtilizationRates``, which NVML does not offer on MIG devices. On a GPU not in MIG mode
each compute process (an MPS client) gets its own sample from ``nvmlDeviceGetProcessUtilization``,
or none (unknown) where the driver gave none for it.
Only reads: nothing here changes a GPU (streaming, MIG and MPS are left as they are). Every call goes
through the adapter of ``nvml_calls.py``, which the reads (``nvml_reads.py``) open and hand over.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from calque.gpu import nvml_errors as nv
from calque.gpu.nvml_types import text_of
from calque.models import DeviceSample
from calque.models.gpu import SampleKind

if TYPE_CHECKING:
    from calque.gpu.nvml_calls import NvmlCalls

FIRST_INTERVAL_S = 0.1
_UNSUPPORTED = (nv.NOT_SUPPORTED, nv.FUNCTION_NOT_FOUND, nv.INVALID_ARGUMENT)


class NvmlSampler:
    """The GPM samples kept between calls, per (GPU index, GPU-instance id or None for the whole GPU)."""

    def __init__(self, calls: NvmlCalls) -> None:
        self._b = calls
        self._nv = calls.lib
        self._gpm: dict[int, bool] = {}
        self._last: dict[tuple[int, int | None], Any] = {}
        self._proc_seen: dict[int, int] = {}  # GPU index -> last process-sample timestamp (µs)

    def close(self) -> None:
        """Free every kept sample; a driver that fails here must not keep NVML from shutting down."""
        for s in self._last.values():
            with contextlib.suppress(nv.GpuDriverError):
                self._b.call("free a GPM sample", self._nv.nvmlGpmSampleFree, s)
        self._last.clear()

    def _gpm_supported(self, index: int, h: Any) -> bool:
        if index not in self._gpm:
            got = self._b.maybe(
                f"ask whether GPU {index} supports GPM", self._nv.nvmlGpmQueryDeviceSupport, h, absent=_UNSUPPORTED
            )
            self._gpm[index] = bool(got is not None and got.isSupportedDevice)
        return self._gpm[index]

    def _sample(self, key: tuple[int, int | None], h: Any) -> Any | None:
        """A fresh GPM sample of the whole GPU (key[1] None) or of one GPU instance; None if refused."""
        s = self._b.call("allocate a GPM sample", self._nv.nvmlGpmSampleAlloc)
        index, gi_id = key
        if gi_id is None:
            got = self._b.maybe(f"sample GPU {index}", self._nv.nvmlGpmSampleGet, h, s, absent=_UNSUPPORTED)
        else:
            got = self._b.maybe(
                f"sample GPU {index}'s GPU instance {gi_id}",
                self._nv.nvmlGpmMigSampleGet,
                h,
                gi_id,
                s,
                absent=(*_UNSUPPORTED, nv.NOT_FOUND),
            )
        if got is None:
            self._b.maybe("free a GPM sample", self._nv.nvmlGpmSampleFree, s, absent=_UNSUPPORTED)
            return None
        return s

    def _metrics(self, key: tuple[int, int | None], h: Any) -> tuple[float | None, float | None] | None:
        """(SM %, graphics %) between the kept sample and a fresh one, which is kept in its place; None
        when GPM measured nothing."""
        new = self._sample(key, h)
        old = self._last.pop(key, None)
        if new is None:
            if old is not None:
                self._b.maybe("free a GPM sample", self._nv.nvmlGpmSampleFree, old, absent=_UNSUPPORTED)
            return None
        self._last[key] = new
        if old is None:
            return None
        mg = self._nv.c_nvmlGpmMetricsGet_t()
        mg.version = self._nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = 2
        mg.sample1, mg.sample2 = old, new
        mg.metrics[0].metricId = self._nv.NVML_GPM_METRIC_SM_UTIL
        mg.metrics[1].metricId = self._nv.NVML_GPM_METRIC_GRAPHICS_UTIL
        got = self._b.maybe("compute GPM metrics", self._nv.nvmlGpmMetricsGet, mg, absent=_UNSUPPORTED)
        self._b.maybe("free a GPM sample", self._nv.nvmlGpmSampleFree, old, absent=_UNSUPPORTED)
        if got is None:
            return None
        values = [
            _percent(m.value) if int(m.nvmlReturn) == nv.SUCCESS else None for m in (got.metrics[0], got.metrics[1])
        ]
        return values[0], values[1]

    def _keys(self) -> list[tuple[int, int | None, Any]]:
        """Every (GPU, GPU instance or None, parent handle) GPM can sample on this host."""
        out: list[tuple[int, int | None, Any]] = []
        for i in range(self._b.count()):
            h = self._b.handle(i)
            if not self._gpm_supported(i, h):
                continue
            out.append((i, None, h))
            if self._b.mig_mode(i)[0]:
                gis = {self._gi_of(m) for m in self._b.mig_handles(i, h)}
                out += [(i, g, h) for g in sorted(gis)]
        return out

    def _gi_of(self, m: Any) -> int:
        return int(self._b.call("read a MIG device's GPU instance", self._nv.nvmlDeviceGetGpuInstanceId, m))

    def take(self) -> list[DeviceSample]:
        keys = self._keys()
        missing = [(i, g, h) for i, g, h in keys if (i, g) not in self._last]
        for i, g, h in missing:  # a first sample to measure from, then one short wait for all of them
            s = self._sample((i, g), h)
            if s is not None:
                self._last[(i, g)] = s
        if missing:
            time.sleep(FIRST_INTERVAL_S)
        measured = {(i, g): self._metrics((i, g), h) for i, g, h in keys}
        gpm = {k: v for k, v in measured.items() if v is not None}
        for stale in set(self._last) - set(measured):  # a GPU instance destroyed since the last call
            self._b.maybe("free a GPM sample", self._nv.nvmlGpmSampleFree, self._last.pop(stale), absent=_UNSUPPORTED)
        out: list[DeviceSample] = []
        for i in range(self._b.count()):
            h = self._b.handle(i)
            uuid = self._uuid(h)
            if self._b.mig_mode(i)[0]:
                sm, gr = gpm.get((i, None), (None, None))
                out.append(self._device(uuid, "gpu", h, sm, gr, "gpm" if (i, None) in gpm else "none"))
                for m in self._b.mig_handles(i, h):
                    g = self._gi_of(m)
                    sm, gr = gpm.get((i, g), (None, None))
                    out.append(self._device(self._uuid(m), "mig", m, sm, gr, "gpm" if (i, g) in gpm else "none"))
            else:
                if (i, None) in gpm:
                    sm, gr = gpm[(i, None)]
                    out.append(self._device(uuid, "gpu", h, sm, gr, "gpm"))
                else:
                    rates = self._b.maybe(
                        f"read GPU {i}'s utilisation", self._nv.nvmlDeviceGetUtilizationRates, h, absent=_UNSUPPORTED
                    )
                    gr = None if rates is None else _percent(rates.gpu)
                    out.append(self._device(uuid, "gpu", h, None, gr, "utilization-rates" if rates else "none"))
                out += self._process_samples(i, h, uuid)
        return out

    def _uuid(self, h: Any) -> str:
        return text_of(self._b.call("read a device's UUID", self._nv.nvmlDeviceGetUUID, h))

    def _device(
        self, uuid: str, kind: SampleKind, h: Any, sm: float | None, gr: float | None, src: str
    ) -> DeviceSample:
        mem = self._b.call("read a device's memory", self._nv.nvmlDeviceGetMemoryInfo, h)
        return DeviceSample(
            device_uuid=uuid,
            kind=kind,
            sm_percent=sm,
            graphics_percent=gr,
            memory_used_mib=int(mem.used) >> 20,
            source=src,
        )

    def _process_samples(self, index: int, h: Any, uuid: str) -> list[DeviceSample]:
        """One sample per compute process on a whole GPU: its SM use since the last call, None (unknown,
        never 0 %) where the driver gave no sample for it: no per-process use at all, none since the
        last call (NOT_FOUND), or none for that process (an MPS client the driver does not sample)."""
        procs = self._b.call(f"list GPU {index}'s processes", self._nv.nvmlDeviceGetComputeRunningProcesses, h)
        if not procs:
            return []
        since = self._proc_seen.get(index, 0)
        try:
            got = self._b.call(
                f"read GPU {index}'s per-process use", self._nv.nvmlDeviceGetProcessUtilization, h, since
            )
        except nv.GpuDriverError:  # not offered, or nothing since ``since`` (NOT_FOUND): every client unknown
            got = None
        sm: dict[int, float] = {}
        # The driver's buffer holds several samples per process since ``since``: the highest is kept,
        # so a client that ran at all in the window reads as having run (never reclaimed on an average).
        for s in got or []:
            sm[int(s.pid)] = max(sm.get(int(s.pid), 0.0), _percent(s.smUtil))
            self._proc_seen[index] = max(self._proc_seen.get(index, 0), int(s.timeStamp))
        return [
            DeviceSample(
                device_uuid=uuid,
                kind="process",
                pid=int(p.pid),
                sm_percent=sm.get(int(p.pid)),
                memory_used_mib=int(p.usedGpuMemory or 0) >> 20,
                source="process-utilization" if int(p.pid) in sm else "none",
            )
            for p in procs
        ]


def _percent(v: Any) -> float:
    return min(100.0, max(0.0, float(v)))
